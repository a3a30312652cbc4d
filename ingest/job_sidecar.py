"""A job task's sidecar: the recorder's JSON Lines format, one line per analysed frame.

Each line is a :class:`~framerelay.schemas.SidecarLine` whose ``id`` (and its result's
``id``) is :func:`framerelay.jobs.frame_result_id` of the frame, so a frame answered
twice is written once: the ledger (:mod:`ingest.job_ledger`) says which frames the file
holds. Opening the file cuts a line torn by a crash (:func:`ingest.recording.sidecar.
repair`, as the recorder does) and reads back which frames of this task it holds; the
file is created (with its folder) when missing. ``segment`` is the input's file name,
``pts``/``time_base`` the frame's own, ``exact`` true: the lines sit on the input's
timeline exactly like a live recording's.

Writes go to the file's buffer on the event loop; :meth:`TaskSidecar.sync` (a thread)
hands them to the disk with ``fsync`` before the checkpoint may pass them.

Where: only under the ingest's ``job_sidecar_dirs`` (:func:`sidecar_problem`, checked
before a task stream starts), so whoever may define streams cannot make the ingest
create, append to or cut (the repair) a ``.jsonl`` file anywhere else.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import IO
from urllib.parse import urlsplit

from pydantic import ValidationError

from framerelay.errors import FramerelayError
from framerelay.jobs import frame_result_id
from framerelay.results import ResultRecord
from framerelay.schemas import SidecarLine
from ingest.recording.sidecar import read_lines, repair

log = logging.getLogger(__name__)


class SidecarError(FramerelayError):
    """The task's sidecar cannot be read or written."""


SIDECAR_DIRS_ENV = "FRAMERELAY_INGEST_JOB_SIDECAR_DIRS"


def sidecar_problem(sidecar: str, dirs: Sequence[Path]) -> str | None:
    """Why this ingest must not write a job sidecar at ``sidecar`` (None: it may): it
    writes them only under ``dirs`` (its ``job_sidecar_dirs``; symbolic links resolved,
    so a link inside that leads out is refused), and none without any. Blocking (stats
    the path's parts); the message does not repeat the path."""
    if not dirs:
        return (
            f"this ingest writes no job sidecars: set {SIDECAR_DIRS_ENV} to the directories "
            "they may be written in"
        )
    where = Path(sidecar).resolve()
    if not any(where.is_relative_to(d.resolve()) for d in dirs):
        return f"job.sidecar lies outside {SIDECAR_DIRS_ENV} (symbolic links resolved)"
    return None


def segment_name(url: str) -> str | None:
    """The input's file name (a path's or a URL's last part; None if it has none)."""
    path = urlsplit(url).path if "://" in url else url
    name = PurePosixPath(path).name
    return name or None


class TaskSidecar:
    """The sidecar of task ``index``, at ``path``."""

    def __init__(self, path: Path, index: int, segment: str | None) -> None:
        self.path = path
        self.index = index
        self.segment = segment
        self._file: IO[str] | None = None
        self.duplicates = 0

    def open(self) -> tuple[list[int], int]:
        """Blocking (a thread): repair the file, open it for appending; the PTS of this
        task's frames it holds, and how many lines they are. :class:`SidecarError`."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                repair(self.path)
            lines = read_lines(self.path)
            self._file = self.path.open("a", encoding="utf-8")
            os.fsync(self._file.fileno())
            _sync_dir(self.path.parent)
        except (OSError, ValidationError, ValueError) as exc:
            raise SidecarError(f"job sidecar {self.path}: {_reason(exc)}") from None
        mine = [x.pts for x in lines if x.id.seq == self.index and x.pts is not None]
        return mine, len(mine)

    def write(self, record: ResultRecord) -> None:
        """Append the line of ``record``'s frame (to the buffer: :meth:`flush`)."""
        if self._file is None:
            raise SidecarError(f"job sidecar {self.path} is not open")
        rid = frame_result_id(self.index, record.pts)
        line = SidecarLine(
            id=rid, segment=self.segment, pts=record.pts, time_base=record.time_base,
            exact=True, result=record.model_copy(update={"id": rid}),
        )  # fmt: skip
        self._file.write(line.model_dump_json() + "\n")

    def flush(self) -> None:
        """Hand buffered lines to the OS (event loop: a short write)."""
        if self._file is not None:
            self._file.flush()

    def sync(self) -> None:
        """Blocking (a thread): the flushed lines reach the disk."""
        if self._file is not None:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _sync_dir(folder: Path) -> None:
    """The folder's entry for a new file reaches the disk too."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _reason(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return f"a line is not a sidecar line ({exc.error_count()} problems): move it away"
    return str(getattr(exc, "strerror", None) or exc)
