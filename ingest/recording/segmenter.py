"""Camera -> fixed-length MP4 segments, by remuxing (no decode, no re-encode).

Runs in its own thread. Each connection to the camera is a new recorder epoch
(as is a timestamp jump); within an epoch PTS are unwrapped (MPEG-TS, 33 bits).
A segment starts at a keyframe and is cut at the first keyframe after
``segment_s``; its timestamps start at 0 (``start_pts`` in the index gives the
offset), so consecutive segments of one epoch join without a gap:
``next.start_pts == prev.end_pts``. Segments are fragmented MP4 (a fragment per
keyframe, at most a second), so a crash loses at most the last fragment.
Every written frame is reported with its arrival time on the wall clock.

A local file is not a camera: it is read at its frame rate (``realtime``, so
its wall clock is that of a camera sending it) and recorded once, then the
segmenter ends (:attr:`Segmenter.ended`); with ``loop`` it starts over at once,
a new epoch each pass. A file that cannot be read is not retried.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path

import av
from av.packet import Packet
from av.video.stream import VideoStream

from framerelay.redact import redact_text, redact_url
from framerelay.timeline import MPEGTS_WRAP_BITS
from ingest import interrupt
from ingest.recording.index import SegmentInfo
from ingest.recording.settings import RecorderSettings
from ingest.source import FramePacer

log = logging.getLogger(__name__)
MAX_JUMP_S = 10.0
HEALTHY_S = 30.0
MOVFLAGS = "frag_keyframe+empty_moov+default_base_moof"


@dataclass(frozen=True, slots=True)
class FrameEvent:
    """A frame written to a segment: recorder epoch, absolute PTS, arrival wall time."""

    epoch: int
    pts: int
    wall: float
    segment: str
    seg_pts: int


@dataclass(frozen=True, slots=True)
class SegmentEvent:
    """A segment was opened (``closed`` False) or finished."""

    info: SegmentInfo
    closed: bool


Event = FrameEvent | SegmentEvent


class _Unwrap:
    """MPEG-TS timestamps wrap at 2^33: keep them increasing (decode order, by DTS)."""

    def __init__(self, wrap_bits: int | None) -> None:
        self.span = 1 << wrap_bits if wrap_bits else 0
        self.offset = 0
        self.last: int | None = None

    def __call__(self, raw: int) -> int:
        if self.span and self.last is not None:
            if raw - self.last < -(self.span >> 1):
                self.offset += self.span
            elif raw - self.last > (self.span >> 1):
                self.offset -= self.span
        self.last = raw
        return raw + self.offset


class _Clock:
    """Wall time of PTS 0 in an epoch: the least-delayed arrival seen (as NTP filters).

    ``fixed``: the first arrival sets it for good (a file read faster than real time,
    whose later frames would otherwise keep pulling the origin back).
    """

    def __init__(self, tb: Fraction, *, fixed: bool = False) -> None:
        self.tb = tb
        self.fixed = fixed
        self.origin = float("inf")

    def see(self, pts: int, wall: float) -> None:
        if not (self.fixed and self.origin != float("inf")):
            self.origin = min(self.origin, wall - float(pts * self.tb))

    def wall(self, pts: int) -> float:
        return self.origin + float(pts * self.tb)


class _SegmentFile:
    """One MP4 being written; packets go out one behind, so each gets its duration."""

    def __init__(self, path: Path, template: VideoStream, tb: Fraction) -> None:
        self.path = path
        self.out = av.open(str(path), "w", format="mp4",
                           options={"movflags": MOVFLAGS, "frag_duration": "1000000"})  # fmt: skip
        self.stream = self.out.add_stream_from_template(template)
        self.stream.time_base = tb
        self.held: tuple[Packet[VideoStream], int, int] | None = None
        self.last_dts = -1
        self.step = 0
        self.frames = 0
        self.errors = 0

    def write(self, packet: Packet[VideoStream], pts: int, dts: int) -> None:
        if self.held is not None:
            self._mux(*self.held, duration=max(1, dts - self.held[2]))
        self.held = (packet, pts, dts)

    def _mux(self, packet: Packet[VideoStream], pts: int, dts: int, duration: int) -> None:
        dts = min(max(dts, self.last_dts + 1), pts)
        packet.pts, packet.dts, packet.duration = pts, dts, duration
        packet.stream = self.stream
        try:
            self.out.mux(packet)
        except (av.error.FFmpegError, ValueError) as exc:
            self.errors += 1
            log.debug("skipping a packet of %s: %s", self.path.name, exc)
            return
        self.last_dts, self.step = dts, duration
        self.frames += 1

    def close(self) -> int:
        """Flush and close; returns the end PTS (relative: last PTS + its duration)."""
        end = 0
        if self.held is not None:
            packet, pts, dts = self.held
            self._mux(packet, pts, dts, duration=self.step or 1)
            end = pts + (self.step or 1)
        self.out.close()
        return end


class Segmenter:
    """Reads the camera and writes segments until ``stop``; reconnects forever."""

    def __init__(
        self,
        settings: RecorderSettings,
        directory: Path,
        sink: Callable[[Event], None],
        take_epoch: Callable[[], int],
    ) -> None:
        self.settings = settings
        self.directory = directory
        self._sink = sink
        self._take_epoch = take_epoch
        self.connects = 0
        self.ended = False
        """A local file was recorded to its end (not looping): nothing more will come."""
        self.last_error: str | None = None
        self._file: _SegmentFile | None = None
        self._info: SegmentInfo | None = None
        self._clock: _Clock | None = None
        self._wrap: int | None = None

    def run(self, stop: threading.Event) -> None:
        delay = 0.5
        while not stop.is_set():
            started = time.monotonic()
            failed = False
            try:
                with interrupt.watching(stop):  # stopping aborts a blocking read at once
                    self._record(stop)
            except (av.error.FFmpegError, OSError) as exc:
                failed = True
                source = self.settings.source
                self.last_error = redact_text(
                    f"{type(exc).__name__}: {exc}".replace(source, redact_url(source))
                )
                log.warning("camera %s: %s", redact_url(source), self.last_error)
            finally:
                self._close_segment()
            if self.settings.is_file and not (self.settings.loop and not failed):
                self._end(stop)
                return
            if self.settings.is_file:
                continue  # looping: the next pass at once
            if time.monotonic() - started > HEALTHY_S:
                delay = 0.5
            stop.wait(delay * random.uniform(0.8, 1.2))  # noqa: S311 - jitter
            delay = min(delay * 2, self.settings.reconnect_max_s)

    def _end(self, stop: threading.Event) -> None:
        self.ended = not stop.is_set()
        if self.ended:
            how = f"failed ({self.last_error})" if self.last_error else "ended"
            log.info(
                "file %s %s: recorded once, not reopened (loop is off)",
                redact_url(self.settings.source),
                how,
            )

    def _record(self, stop: threading.Event) -> None:
        s = self.settings
        options = {"analyzeduration": str(int(s.analyze_s * 1e6))}
        with av.open(s.source, options=options,
                     timeout=(s.open_timeout_s, s.read_timeout_s)) as container:  # fmt: skip
            stream = container.streams.video[0]
            tb = Fraction(stream.time_base or Fraction(1, 90_000))
            wrap = MPEGTS_WRAP_BITS if "mpegts" in (container.format.name or "") else None
            self.connects += 1
            paced = s.is_file and s.realtime
            epoch, unwrap = self._take_epoch(), _Unwrap(wrap)
            clock = _Clock(tb, fixed=s.is_file)
            self._clock, self._wrap = clock, wrap
            pacer = FramePacer() if paced else None
            last_dts: int | None = None
            for packet in container.demux(stream):
                if stop.is_set():
                    return
                if packet.pts is None or packet.size == 0:
                    continue
                wall = time.time()
                raw_dts = packet.dts if packet.dts is not None else packet.pts
                dts = unwrap(raw_dts)
                pts = packet.pts + (dts - raw_dts)
                if pacer is not None:
                    pacer.wait(float(dts * tb), stop)
                    wall = time.time()
                if last_dts is not None and not 0 <= float((dts - last_dts) * tb) <= MAX_JUMP_S:
                    self._close_segment()
                    epoch, clock = self._take_epoch(), _Clock(tb, fixed=s.is_file)
                    self._clock = clock
                last_dts = dts
                clock.see(pts, wall)
                self._write(packet, stream, epoch, pts, dts, wall)

    def _write(
        self,
        packet: Packet[VideoStream],
        stream: VideoStream,
        epoch: int,
        pts: int,
        dts: int,
        wall: float,
    ) -> None:
        info, clock = self._info, self._clock
        assert clock is not None  # noqa: S101 - set when the camera opened
        if info is not None and packet.is_keyframe:
            if float((pts - info.start_pts) * info.tb) >= self.settings.segment_s:
                self._close_segment()
                info = None
        if info is None:
            if not packet.is_keyframe:
                return
            info = self._open_segment(stream, epoch, pts, clock.wall(pts))
        assert self._file is not None  # noqa: S101 - opened with the info
        self._file.write(packet, pts - info.start_pts, dts - info.start_pts)
        self._sink(FrameEvent(epoch, pts, wall, info.name, pts - info.start_pts))

    def _open_segment(self, stream: VideoStream, epoch: int, pts: int, wall: float) -> SegmentInfo:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(wall)) + f"{wall % 1:.3f}"[1:]
        name = f"{self.settings.stream_id}-{stamp}-e{epoch}.mp4".replace(":", "_")
        tb = Fraction(stream.time_base or Fraction(1, 90_000))
        self._file = _SegmentFile(self.directory / name, stream, tb)
        info = SegmentInfo(name, epoch, pts, pts, (tb.numerator, tb.denominator), wall, wall,
                           wrap_bits=self._wrap)  # fmt: skip
        self._info = info
        self._sink(SegmentEvent(replace(info), closed=False))
        return info

    def _close_segment(self) -> None:
        file, info = self._file, self._info
        self._file, self._info = None, None
        if file is None or info is None:
            return
        try:
            end = file.close()
        except (av.error.FFmpegError, OSError) as exc:
            log.warning("closing segment %s: %s", info.name, exc)
            end = 0
        if self._clock is not None:
            info.start_wall = self._clock.wall(info.start_pts)
        info.end_pts = info.start_pts + end
        info.end_wall = info.wall_of(info.end_pts)
        info.frames = file.frames
        info.bytes = file.path.stat().st_size if file.path.exists() else 0
        info.state = "complete"
        self._sink(SegmentEvent(replace(info), closed=True))
