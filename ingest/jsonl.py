"""Append results to a JSON Lines file (one result per line)."""

from __future__ import annotations

import io
import time
from pathlib import Path

from framerelay.results import ResultRecord


class JsonlWriter:
    """Buffered writer; ``write`` is cheap and safe to call from the event loop."""

    def __init__(self, path: Path, flush_every_s: float = 1.0) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: io.TextIOWrapper = path.open("w", encoding="utf-8")
        self._flush_every = flush_every_s
        self._last_flush = time.monotonic()
        self.written = 0

    def write(self, record: ResultRecord) -> None:
        self._file.write(record.model_dump_json())
        self._file.write("\n")
        self.written += 1
        now = time.monotonic()
        if now - self._last_flush >= self._flush_every:
            self._file.flush()
            self._last_flush = now

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            self._file.close()
