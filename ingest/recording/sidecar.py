"""JSON Lines sidecars: one per segment (``<segment>.jsonl``) plus hourly gap files.

Every line is a :class:`~framerelay.schemas.SidecarLine`. A result id is
written once: ids written recently (``dedup_s``) are remembered, ids of a file
from before a restart are read back the first time that file is touched, and
a line torn by a crash is cut off at startup (its result was not acknowledged,
so it comes again).
"""

from __future__ import annotations

import collections
import logging
import os
import time
from pathlib import Path
from typing import IO

from framerelay.results import ResultId
from framerelay.schemas import SidecarLine

log = logging.getLogger(__name__)
GAP_DIR = "gaps"


def gap_file(captured_at: float) -> str:
    """The gap file for results captured in that hour (UTC)."""
    return f"{GAP_DIR}/{time.strftime('%Y%m%dT%H', time.gmtime(captured_at))}.jsonl"


def _complete(data: bytes) -> bytes:
    """Up to the last newline: what follows is a line the recorder is still writing (its
    buffer flushes mid-line) or one torn by a crash, not a result yet."""
    return data[: data.rfind(b"\n") + 1]


def repair(path: Path) -> set[ResultId]:
    """Cut a torn last line (a crash mid-write); return the ids the file holds."""
    data = path.read_bytes()
    if len(keep := _complete(data)) < len(data):
        with path.open("r+b") as f:
            f.truncate(len(keep))
        log.warning("%s: cut a torn last line (%d bytes)", path.name, len(data) - len(keep))
    return {SidecarLine.model_validate_json(line).id for line in keep.splitlines() if line}


def read_lines(path: Path) -> list[SidecarLine]:
    """The file's complete lines (see :func:`_complete`)."""
    if not path.exists():
        return []
    data = _complete(path.read_bytes())
    return [SidecarLine.model_validate_json(x) for x in data.splitlines() if x]


class SidecarStore:
    """Appends sidecar lines, at most once per result id."""

    def __init__(self, directory: Path, *, dedup_s: float = 3600.0, max_open: int = 8) -> None:
        self.directory = directory
        (directory / GAP_DIR).mkdir(parents=True, exist_ok=True)
        self.dedup_s = dedup_s
        self.max_open = max_open
        self._recent: collections.OrderedDict[ResultId, float] = collections.OrderedDict()
        self._files: collections.OrderedDict[str, IO[str]] = collections.OrderedDict()
        self._known: collections.OrderedDict[str, set[ResultId]] = collections.OrderedDict()
        self.written = 0
        self.duplicates = 0

    def recover(self) -> int:
        """Repair files written within ``dedup_s``; remember their ids. Returns how many."""
        cutoff = time.time() - self.dedup_s
        paths = [*self.directory.glob("*.jsonl"), *(self.directory / GAP_DIR).glob("*.jsonl")]
        n = 0
        for path in paths:
            if path.stat().st_mtime < cutoff:
                continue
            for rid in repair(path):
                self._recent[rid] = time.time()
                n += 1
        return n

    def seen(self, name: str, rid: ResultId) -> bool:
        if rid in self._recent:
            return True
        known = self._known.get(name)
        if known is None:
            path = self.directory / name
            known = repair(path) if path.exists() else set()
            self._known[name] = known
            while len(self._known) > self.max_open * 4:
                self._known.popitem(last=False)
        return rid in known

    def write(self, name: str, line: SidecarLine) -> bool:
        """Append ``line`` to sidecar ``name`` unless its id was written; True if written."""
        if self.seen(name, line.id):
            self.duplicates += 1
            return False
        self._file(name).write(line.model_dump_json() + "\n")
        self._recent[line.id] = time.time()
        if name in self._known:
            self._known[name].add(line.id)
        self.written += 1
        self._forget_old()
        return True

    def _file(self, name: str) -> IO[str]:
        f = self._files.get(name)
        if f is None:
            f = (self.directory / name).open("a", encoding="utf-8")
            self._files[name] = f
            while len(self._files) > self.max_open:
                _, old = self._files.popitem(last=False)
                old.close()
        else:
            self._files.move_to_end(name)
        return f

    def _forget_old(self) -> None:
        cutoff = time.time() - self.dedup_s
        while self._recent and next(iter(self._recent.values())) < cutoff:
            self._recent.popitem(last=False)

    def flush(self) -> None:
        """Hand written lines to the OS (they survive a crash of this process)."""
        for f in self._files.values():
            f.flush()

    def close(self, name: str | None = None) -> None:
        names = [name] if name is not None else list(self._files)
        for n in names:
            f = self._files.pop(n, None)
            if f is not None:
                f.close()

    def move_to_gaps(self, name: str, keep: set[int]) -> int:
        """Lines of sidecar ``name`` whose frame (pts) is not in ``keep`` go to gap files.

        After a crash the last fragment of a segment may be lost: its results
        then have no frame there.
        """
        path = self.directory / name
        self.close(name)  # what this store still buffers for it is read too
        lines = read_lines(path)
        moved = [x for x in lines if x.pts not in keep]
        if not moved:
            return 0
        kept = "".join(x.model_dump_json() + "\n" for x in lines if x.pts in keep)
        for line in moved:
            gap = SidecarLine(id=line.id, segment=None, pts=None, time_base=None, exact=False,
                              result=line.result)  # fmt: skip
            self._file(gap_file(line.result.captured_at)).write(gap.model_dump_json() + "\n")
        self.flush()
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text(kept, encoding="utf-8")
        os.replace(tmp, path)
        self._known.pop(name, None)
        return len(moved)
