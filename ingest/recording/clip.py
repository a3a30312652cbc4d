"""Render a clip from recorded segments with the sidecar's results drawn on.

Frames between two wall-clock times are decoded from the segments that cover
them; each frame gets the boxes, track ids and labels of the sidecar line with
exactly its PTS (results are placed on frames by PTS when recorded, so nothing
is guessed here), and the clip is encoded with H.264 (MPEG-4 Part 2 where the
FFmpeg build has no libx264). The clip keeps the recording's timing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import cast

import av
from av.video.stream import VideoStream

from framerelay.errors import ConfigError
from framerelay.schemas import SidecarLine
from ingest.recording.draw import Image, draw_detections
from ingest.recording.index import SegmentIndex, SegmentInfo
from ingest.recording.sidecar import read_lines

log = logging.getLogger(__name__)
CLIP_TB = Fraction(1, 90_000)


@dataclass(frozen=True, slots=True)
class ClipSummary:
    frames: int
    frames_with_results: int
    boxes: int
    segments: int
    codec: str


def parse_time(text: str) -> float:
    """Unix seconds, or ISO 8601 (UTC unless it says otherwise)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"bad time {text!r}: give Unix seconds or ISO 8601") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def _codec() -> str:
    return "libx264" if "libx264" in av.codecs_available else "mpeg4"


class _ClipWriter:
    def __init__(self, path: Path, width: int, height: int, rate: Fraction) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.out = av.open(str(path), "w")
        self.codec = _codec()
        self.stream = cast("VideoStream", self.out.add_stream(self.codec, rate=rate))
        self.stream.width, self.stream.height, self.stream.pix_fmt = width, height, "yuv420p"
        self.stream.time_base = CLIP_TB
        self.stream.options = {"crf": "16", "preset": "veryfast"} if self.codec == "libx264" else {
            "qscale": "2"}  # fmt: skip
        self.last_pts = -1
        self.frames = 0

    def add(self, frame: av.VideoFrame, t: float) -> None:
        pts = max(self.last_pts + 1, round(t / CLIP_TB))
        frame.pts, frame.time_base = pts, CLIP_TB
        self.last_pts = pts
        for packet in self.stream.encode(frame):
            self.out.mux(packet)
        self.frames += 1

    def close(self) -> None:
        for packet in self.stream.encode(None):
            self.out.mux(packet)
        self.out.close()


def render_clip(directory: Path, start: float, end: float, out: Path) -> ClipSummary:
    """Write ``out`` from the recording in ``directory`` (one stream) between two times."""
    if end <= start:
        raise ConfigError("the clip's end must be after its start")
    index = SegmentIndex.load(directory, directory.name)
    segments = sorted(index.overlapping(start, end), key=lambda s: s.start_wall)
    if not segments:
        raise ConfigError(f"nothing was recorded in {directory} between {start} and {end}")
    writer: _ClipWriter | None = None
    with_results = boxes = 0
    for seg in segments:
        lines = {x.pts: x for x in read_lines(directory / seg.sidecar) if x.pts is not None}
        for frame, wall in _frames(directory, seg, start, end):
            if writer is None:
                writer = _ClipWriter(out, frame.width, frame.height, _rate(directory, seg))
            line = lines.get(frame.pts or 0)
            if line is not None and line.result.detections:
                frame = _drawn(frame, line)
                with_results += 1
                boxes += len(line.result.detections)
            writer.add(frame, wall - start)
    if writer is None:
        raise ConfigError("the segments hold no frame in that time range")
    writer.close()
    return ClipSummary(writer.frames, with_results, boxes, len(segments), writer.codec)


def _frames(
    directory: Path, seg: SegmentInfo, start: float, end: float
) -> Iterator[tuple[av.VideoFrame, float]]:
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


def _rate(directory: Path, seg: SegmentInfo) -> Fraction:
    with av.open(str(directory / seg.name)) as container:
        rate = container.streams.video[0].average_rate
    return Fraction(rate) if rate else Fraction(25)


def _drawn(frame: av.VideoFrame, line: SidecarLine) -> av.VideoFrame:
    img = cast("Image", frame.to_ndarray(format="rgb24"))
    draw_detections(img, line.result.detections)
    drawn = av.VideoFrame.from_ndarray(img, format="rgb24")
    drawn.pts = frame.pts
    return drawn
