"""The segment index of one recorded stream: ``<dir>/index.json``.

Each segment is listed when it is opened (``state: recording``) and updated
when it is closed (``complete``). After a crash the one left ``recording`` is
probed: the fragments that reached the disk make it a ``partial`` segment (or
it is dropped if none did). The index is rewritten atomically (temp file +
rename) so a crash never leaves it half-written. Retention deletes the oldest
segments with their sidecars, by age and by total size.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Literal

import av

log = logging.getLogger(__name__)
SegmentState = Literal["recording", "complete", "partial"]


@dataclass(slots=True)
class SegmentInfo:
    """One MP4 segment: where it is on the recorder's timeline and on the wall clock."""

    name: str
    epoch: int
    start_pts: int
    end_pts: int
    time_base: tuple[int, int]
    start_wall: float
    end_wall: float
    frames: int = 0
    bytes: int = 0
    state: SegmentState = "recording"
    wrap_bits: int | None = None

    @property
    def sidecar(self) -> str:
        return self.name.rsplit(".", 1)[0] + ".jsonl"

    @property
    def tb(self) -> Fraction:
        return Fraction(*self.time_base)

    def wall_of(self, pts: int) -> float:
        """Wall-clock time of a frame of this segment (absolute recorder PTS)."""
        return self.start_wall + float((pts - self.start_pts) * self.tb)


@dataclass(slots=True)
class SegmentIndex:
    directory: Path
    stream_id: str
    segments: list[SegmentInfo] = field(default_factory=list)
    next_epoch: int = 0

    @property
    def path(self) -> Path:
        return self.directory / "index.json"

    @classmethod
    def load(cls, directory: Path, stream_id: str) -> SegmentIndex:
        directory.mkdir(parents=True, exist_ok=True)
        index = cls(directory, stream_id)
        if index.path.exists():
            raw = json.loads(index.path.read_text(encoding="utf-8"))
            index.next_epoch = int(raw.get("next_epoch", 0))
            for s in raw.get("segments", []):
                s["time_base"] = tuple(s["time_base"])
                index.segments.append(SegmentInfo(**s))
        return index

    def save(self) -> None:
        doc = {
            "stream_id": self.stream_id,
            "next_epoch": self.next_epoch,
            "segments": [asdict(s) for s in self.segments],
        }
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)

    def take_epoch(self) -> int:
        """A recorder epoch never used before (epochs survive restarts)."""
        epoch = self.next_epoch
        self.next_epoch += 1
        self.save()
        return epoch

    def get(self, name: str) -> SegmentInfo | None:
        return next((s for s in self.segments if s.name == name), None)

    def upsert(self, info: SegmentInfo) -> None:
        for i, s in enumerate(self.segments):
            if s.name == info.name:
                self.segments[i] = info
                break
        else:
            self.segments.append(info)
        self.save()

    def overlapping(self, start_wall: float, end_wall: float) -> list[SegmentInfo]:
        return [s for s in self.segments if s.end_wall >= start_wall and s.start_wall <= end_wall]

    def recover(self) -> list[tuple[SegmentInfo, list[int]]]:
        """Settle segments a crash left ``recording``: each with the PTS still readable.

        A segment with no readable frame is removed from the index (and disk);
        it is returned with an empty list.
        """
        settled = []
        for seg in [s for s in self.segments if s.state == "recording"]:
            pts = probe_pts(self.directory / seg.name)
            settled.append((seg, pts))
            if not pts:
                log.warning("segment %s has no readable frame after a crash; dropping it", seg.name)
                self.segments.remove(seg)
                (self.directory / seg.name).unlink(missing_ok=True)
                continue
            step = pts[-1] - pts[-2] if len(pts) > 1 else 0
            seg.end_pts = seg.start_pts + pts[-1] + step
            seg.end_wall = seg.wall_of(seg.end_pts)
            seg.frames = len(pts)
            seg.bytes = (self.directory / seg.name).stat().st_size
            seg.state = "partial"
        self.save()
        return settled

    def apply_retention(
        self, retention_s: float, max_bytes: int, now: float | None = None
    ) -> list[SegmentInfo]:
        """Delete segments older than ``retention_s`` or beyond ``max_bytes`` (oldest first)."""
        t = time.time() if now is None else now
        done = [s for s in self.segments if s.state != "recording"]
        done.sort(key=lambda s: s.start_wall)
        total = sum(s.bytes for s in self.segments)
        removed = []
        for seg in done:
            if seg.end_wall >= t - retention_s and (not max_bytes or total <= max_bytes):
                break
            total -= seg.bytes
            removed.append(seg)
        for seg in removed:
            self.segments.remove(seg)
            for name in (seg.name, seg.sidecar):
                (self.directory / name).unlink(missing_ok=True)
        if removed:
            self.save()
            log.info("retention removed %d segment(s)", len(removed))
        return removed


def probe_pts(path: Path) -> list[int]:
    """The PTS of every video packet that can be read from a segment file."""
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            return sorted(p.pts for p in container.demux(stream) if p.pts is not None)
    except (av.error.FFmpegError, OSError, IndexError) as exc:
        log.debug("probing %s: %s", path, exc)
        return []
