"""Render a clip from recorded segments with the sidecar's results drawn on.

Frames between two wall-clock times are decoded from the segments that cover
them. A result is placed on exactly the frame it was computed on (the sidecar
line with that frame's PTS: placed by PTS when recorded, so nothing is guessed
here) and its boxes are held on the frames after it until the next result for
that track, or until stale (:mod:`ingest.recording.hold`), so a clip of 5 fps
results on 25 fps video does not flicker. Segments that overlap in time (a
file recorded several times by older recorders) give each instant once: a
frame not later than the last one written is skipped. The clip is encoded with
H.264 (MPEG-4 Part 2 where the FFmpeg build has no libx264), keeps the
recording's timing, and is written under a temporary name renamed at the end:
a failure (:class:`ClipError`, one line) leaves no partial file.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import cast

import av
from av.video.stream import VideoStream
from pydantic import ValidationError

from framerelay.errors import ConfigError, FramerelayError
from framerelay.results import DetectionOut
from framerelay.schemas import SidecarLine
from ingest.recording.draw import Image, draw_detections
from ingest.recording.hold import BoxHold, default_hold_s
from ingest.recording.index import SegmentIndex, SegmentInfo
from ingest.recording.sidecar import read_lines

log = logging.getLogger(__name__)
CONTAINERS = (".mp4", ".m4v", ".mov", ".mkv")
CLIP_TB = Fraction(1, 1000)
"""Clip timestamps in milliseconds (MPEG-4 Part 2 allows no time base finer than 1/65535)."""


class ClipError(FramerelayError):
    """The clip could not be rendered (nothing recorded then, unreadable files, encoder)."""


@dataclass(frozen=True, slots=True)
class ClipSummary:
    frames: int
    frames_with_results: int
    boxes: int
    segments: int
    codec: str
    hold_s: float = 0.0
    skipped: int = 0
    """Frames left out because an overlapping segment already gave that time."""
    drawn: tuple[tuple[DetectionOut, ...], ...] = field(default=(), repr=False)
    """The boxes drawn on each frame of the clip, in order."""


def parse_time(text: str) -> float:
    """Unix seconds, or ISO 8601 (UTC unless it says otherwise)."""
    try:
        value = float(text)
    except ValueError:
        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(f"bad time {text!r}: give Unix seconds or ISO 8601") from None
        value = (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    if not math.isfinite(value):
        raise ConfigError(f"bad time {text!r}: give Unix seconds or ISO 8601")
    return value


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _codec() -> str:
    return "libx264" if "libx264" in av.codecs_available else "mpeg4"


class _ClipWriter:
    def __init__(self, path: Path, width: int, height: int, rate: Fraction) -> None:
        self.out = av.open(str(path), "w")
        self.codec = _codec()
        self.stream = cast("VideoStream", self.out.add_stream(self.codec, rate=rate))
        self.stream.width, self.stream.height, self.stream.pix_fmt = width, height, "yuv420p"
        self.stream.time_base = self.stream.codec_context.time_base = CLIP_TB
        self.stream.options = {"crf": "16", "preset": "veryfast"} if self.codec == "libx264" else {
            "qscale": "2"}  # fmt: skip
        self.last_pts = -1
        self.frames = 0

    def add(self, frame: av.VideoFrame, t: float) -> None:
        pts = max(self.last_pts + 1, round(t / CLIP_TB))
        frame.pts, frame.time_base = pts, CLIP_TB
        frame.pict_type = 0  # the source's frame types mean nothing to this encoder
        self.last_pts = pts
        for packet in self.stream.encode(frame):
            self.out.mux(packet)
        self.frames += 1

    def close(self) -> None:
        for packet in self.stream.encode(None):
            self.out.mux(packet)
        self.out.close()


@dataclass(slots=True)
class _Render:
    """One clip being rendered: the writer (opened on the first frame) and what was drawn."""

    tmp: Path
    start: float
    hold: BoxHold
    writer: _ClipWriter | None = None
    drawn: list[tuple[DetectionOut, ...]] = field(default_factory=list)
    with_results: int = 0
    boxes: int = 0
    skipped: int = 0
    last_wall: float = -math.inf
    unreadable: list[str] = field(default_factory=list)

    def frame(
        self, frame: av.VideoFrame, wall: float, line: SidecarLine | None, rate: Fraction
    ) -> None:
        if wall <= self.last_wall:
            self.skipped += 1
            return
        self.last_wall = wall
        if line is not None:
            self.hold.result(wall, line.result.detections)
            self.with_results += bool(line.result.detections)
        dets = self.hold.at(wall)
        if dets:
            frame = _drawn(frame, dets)
            self.boxes += len(dets)
        if self.writer is None:
            self.writer = _ClipWriter(self.tmp, frame.width, frame.height, rate)
        self.writer.add(frame, wall - self.start)
        self.drawn.append(tuple(dets))


def render_clip(
    directory: Path, start: float, end: float, out: Path, *, hold_s: float | None = None
) -> ClipSummary:
    """Write ``out`` from the recording in ``directory`` (one stream) between two times.

    ``hold_s``: how long a box stays without a new result for its track (None: twice
    the median interval between the results in the clip; 0: only on its own frame).
    """
    if end <= start:
        raise ConfigError("the clip's end must be after its start")
    if out.suffix.lower() not in CONTAINERS:
        raise ConfigError(f"the clip's name must end in {', '.join(CONTAINERS)}: got {out.name}")
    segments = _segments(directory, start, end)
    tmp = out.with_name(f".{out.stem}.{os.getpid()}.partial{out.suffix}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        summary = _render(directory, segments, start, end, tmp, hold_s)
        os.replace(tmp, out)
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise ClipError(f"cannot write {out}: {_reason(exc)}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return summary


def _segments(directory: Path, start: float, end: float) -> list[SegmentInfo]:
    try:
        index = SegmentIndex.load(directory, directory.name)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ClipError(f"cannot read {directory / 'index.json'}: {_reason(exc)}") from None
    segments = sorted(index.overlapping(start, end), key=lambda s: (s.start_wall, s.epoch))
    if not segments:
        held = ""
        if index.segments:
            first = min(s.start_wall for s in index.segments)
            last = max(s.end_wall for s in index.segments)
            held = f" (it holds {_iso(first)} to {_iso(last)})"
        raise ClipError(f"nothing was recorded in {directory} between {_iso(start)} and "
                        f"{_iso(end)}{held}")  # fmt: skip
    return segments


def _render(
    directory: Path,
    segments: list[SegmentInfo],
    start: float,
    end: float,
    tmp: Path,
    hold_s: float | None,
) -> ClipSummary:
    sidecars = {seg.name: _lines(directory, seg) for seg in segments}
    if hold_s is None:
        times = (x.result.captured_at for lines in sidecars.values() for x in lines.values())
        hold_s = default_hold_s(times)
    render = _Render(tmp, start, BoxHold(hold_s))
    epoch: int | None = None
    try:
        for seg in segments:
            if seg.epoch != epoch:
                render.hold.reset()
                epoch = seg.epoch
            lines, rate = sidecars[seg.name], _rate(directory, seg)
            for frame, wall in _frames(directory, seg, start, end, render.unreadable):
                render.frame(frame, wall, lines.get(frame.pts or 0), rate)
        if render.writer is None:
            bad = f" ({len(render.unreadable)} unreadable, first {render.unreadable[0]})" if (
                render.unreadable) else ""  # fmt: skip
            raise ClipError(f"the segments hold no frame in that time range{bad}")
        render.writer.close()
        if render.unreadable:
            n, first = len(render.unreadable), render.unreadable[0]
            log.warning("%d segment(s) unreadable or cut short, first %s: the clip has what "
                        "they held up to there", n, first)  # fmt: skip
    finally:
        if render.writer is not None:
            with contextlib.suppress(av.error.FFmpegError, OSError, ValueError):
                render.writer.out.close()
    w = render.writer
    return ClipSummary(w.frames, render.with_results, render.boxes, len(segments), w.codec,
                       hold_s, render.skipped, tuple(render.drawn))  # fmt: skip


def _lines(directory: Path, seg: SegmentInfo) -> dict[int, SidecarLine]:
    path = directory / seg.sidecar
    try:
        return {x.pts: x for x in read_lines(path) if x.pts is not None}
    except (OSError, ValidationError) as exc:
        raise ClipError(f"cannot read the sidecar {path}: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    """One line: FFmpeg's and the OS's messages without the noise."""
    if isinstance(exc, ValidationError):
        return f"{exc.error_count()} invalid field(s), first: {exc.errors()[0]['msg']}"
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return str(text).splitlines()[0]


def _frames(
    directory: Path, seg: SegmentInfo, start: float, end: float, unreadable: list[str]
) -> Iterator[tuple[av.VideoFrame, float]]:
    """The segment's frames in the time range; a missing or damaged segment (a crash cut
    it, retention removed it) gives what it can and is noted in ``unreadable``."""
    try:
        with av.open(str(directory / seg.name)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                wall = seg.wall_of(seg.start_pts + frame.pts)
                if start <= wall <= end:
                    yield frame, wall
                elif wall > end:
                    break
    except (av.error.FFmpegError, OSError, IndexError) as exc:
        unreadable.append(f"{seg.name}: {_reason(exc)}")


def _rate(directory: Path, seg: SegmentInfo) -> Fraction:
    try:
        with av.open(str(directory / seg.name)) as container:
            rate = container.streams.video[0].average_rate
    except (av.error.FFmpegError, OSError, IndexError):
        rate = None
    return Fraction(rate) if rate else Fraction(25)


def _drawn(frame: av.VideoFrame, detections: list[DetectionOut]) -> av.VideoFrame:
    img = cast("Image", frame.to_ndarray(format="rgb24"))
    draw_detections(img, detections)
    drawn = av.VideoFrame.from_ndarray(img, format="rgb24")
    drawn.pts = frame.pts
    return drawn
