"""Video sources decoded with PyAV (files, RTSP, HLS, HTTP, RTMP...).

``AVSource.frames()`` is a blocking generator run in the stream's decode
thread. It yields decoded frames with their raw PTS and the ingest-clock time
of decoding, and :class:`Restart` markers where the timeline must start a new
epoch (a looping file starting over). Corrupt packets are counted and skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction

import av

from framerelay.errors import SourceError
from framerelay.timeline import MPEGTS_WRAP_BITS

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """Where and how to read a stream."""

    url: str
    realtime: bool = False
    """Pace frames at their PTS rate (makes a file behave like a live camera)."""
    loop: bool = False
    """Start a file over at its end (each pass is a new epoch)."""
    open_timeout_s: float = 10.0
    read_timeout_s: float = 10.0
    options: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Decoded:
    """One decoded frame, stamped on the ingest clock when it left the decoder."""

    frame: av.VideoFrame
    raw_pts: int | None
    time_base: Fraction
    captured_at: float


@dataclass(frozen=True, slots=True)
class Restart:
    """The source started over (loop or reopen): PTS restart, new epoch."""


def redact(url: str) -> str:
    """The URL with any ``user:password@`` removed, for logs and errors."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    return f"{scheme}://***@{rest.split('@', 1)[1]}"


class AVSource:
    """A PyAV-decoded video source. One instance per stream; blocking."""

    def __init__(self, spec: SourceSpec, on_decode_error: Callable[[], None] | None = None) -> None:
        self.spec = spec
        self._on_error = on_decode_error or (lambda: None)
        self.wrap_bits: int | None = None
        self.fps: float = 0.0

    def _open(self) -> av.container.InputContainer:
        try:
            container = av.open(
                self.spec.url,
                options=dict(self.spec.options),
                timeout=(self.spec.open_timeout_s, self.spec.read_timeout_s),
            )
        except (av.error.FFmpegError, OSError) as exc:
            raise SourceError(f"cannot open {redact(self.spec.url)}: {exc}") from None
        if not container.streams.video:
            container.close()
            raise SourceError(f"{redact(self.spec.url)} has no video stream")
        fmt = container.format.name or ""
        self.wrap_bits = MPEGTS_WRAP_BITS if "mpegts" in fmt else None
        return container

    def frames(self, stop: threading.Event) -> Iterator[Decoded | Restart]:
        """Decode until the end (or forever when looping) or until ``stop``."""
        first = True
        while not stop.is_set():
            if not first:
                yield Restart()
            first = False
            container = self._open()
            try:
                yield from self._decode(container, stop)
            finally:
                container.close()
            if not self.spec.loop:
                return

    def _decode(
        self, container: av.container.InputContainer, stop: threading.Event
    ) -> Iterator[Decoded]:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        tb = stream.time_base or Fraction(1, 90_000)
        self.fps = float(stream.average_rate or 0.0)
        pacer = _Pacer() if self.spec.realtime else None
        for packet in container.demux(stream):
            if stop.is_set():
                return
            try:
                frames = packet.decode()
            except av.error.FFmpegError as exc:
                self._on_error()
                log.debug("decode error in %s: %s", redact(self.spec.url), exc)
                continue
            for frame in frames:
                if pacer is not None and frame.pts is not None:
                    pacer.wait(float(frame.pts * tb), stop)
                yield Decoded(frame, frame.pts, Fraction(tb), time.time())


class _Pacer:
    """Sleeps so frames come out at the rate of their PTS."""

    def __init__(self) -> None:
        self._origin: tuple[float, float] | None = None  # (pts seconds, monotonic)

    def wait(self, t: float, stop: threading.Event) -> None:
        now = time.monotonic()
        if self._origin is None or t < self._origin[0]:
            self._origin = (t, now)
            return
        due = self._origin[1] + (t - self._origin[0])
        if due - now > 5.0:  # a forward PTS jump: re-anchor instead of stalling
            self._origin = (t, now)
        elif due > now:
            stop.wait(due - now)
