"""Video sources decoded with PyAV: files, RTSP (TCP/UDP), RTMP, HTTP(S), HLS.

A *session* is one ``av.open`` up to its end. :meth:`AVSource.session` runs
one, blocking, in the stream's decode thread: it reports the opened stream
(:class:`Opened`), then every decoded frame (:class:`Decoded`, stamped on the
ingest clock as it leaves the decoder), and returns at the end of a file or
when asked to stop. Everything that goes wrong raises a :class:`SourceError`
subclass with an actionable message; the reconnect loop
(:mod:`ingest.reconnect`) decides what to do about it.

Never hang: PyAV is opened with ``timeout=(open_s, read_s)``, so a stalled
server raises (:class:`SourceStalled`) after the read timeout instead of
blocking forever; a stopped source's blocking open or read returns at once
(:mod:`ingest.interrupt`), so its socket is free again (a deleted UDP stream
can be re-added on the same port right away). A live source (RTSP, RTMP...) reaching end-of-file has
been disconnected (a killed RTSP server looks exactly like a normal end):
:class:`SourceLost`. Corrupt packets are counted and skipped.

A source's size is checked at open (from the headers, before decoding) and at
every change; outside ``min_width``...``max_height`` it is refused
(:class:`SizeRefused`: FAILED, never retried). A 401/403 raises
:class:`SourceAuthFailed` (retried slowly). Large frames' memory goes back to
the system after their session (:meth:`AVSource.release`, :mod:`framerelay.memory`).

Open nothing else: every ``av.open`` carries FFmpeg's ``protocol_whitelist`` for the
source's scheme (:func:`ingest.urls.protocols_for`), nested opens included (HLS segments,
RTP under RTSP, redirects), so a playlist cannot reach ``file:``, ``concat:`` or
``gopher:``. A local file that cannot be opened gets one reason, whether it exists or
not (FFmpeg's own goes to the log).

Never leak secrets: the URL given to FFmpeg carries the credentials, but
:attr:`SourceSpec.display` (what logs and errors show) does not, and every
FFmpeg message is scrubbed before it goes anywhere (FFmpeg errors quote the
URL they failed on).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING
from urllib.parse import quote

import av
from av.video.stream import VideoStream

if TYPE_CHECKING:
    from av.packet import Packet

from framerelay import memory
from framerelay.errors import SourceError
from framerelay.redact import redact_text, redact_url, secret_values
from framerelay.timeline import MPEGTS_WRAP_BITS
from ingest import interrupt
from ingest.catchup import Catchup
from ingest.pacing import FramePacer as FramePacer
from ingest.resume import ResumeAt, seek
from ingest.settings import LIVE_SCHEMES as LIVE_SCHEMES
from ingest.settings import StreamConfig
from ingest.urls import local_path, protocols_for, source_scheme

log = logging.getLogger(__name__)
CREDENTIAL_SCHEMES = frozenset({"rtsp", "rtsps", "rtmp", "rtmps", "rtmpt", "http", "https"})
HTTP = frozenset({"http", "https"})
WRAP_BITS = {"mpegts": MPEGTS_WRAP_BITS, "hls": MPEGTS_WRAP_BITS, "flv": 32, "live_flv": 32}
"""Width of the PTS counter by container (RTSP: FFmpeg already unwraps RTP time)."""
PROTOCOL_DEFAULTS: dict[str, dict[str, str]] = {
    # FLV probing waits ~5 s for metadata by default; the stream headers come sooner.
    "rtmp": {"analyzeduration": "1000000"},
    "rtmps": {"analyzeduration": "1000000"},
}
NO_FRAME_PACKETS = 250
"""On a network source, this many packets in a row without a frame (and at least
``read_timeout_s`` of them) means the decoder cannot follow (codec change,
garbage): reopen, which probes the stream again."""
LARGE_FRAME_AREA = 1920 * 1080
"""A session with frames larger than this trims the C heap when it ends."""
MAX_TIME_BASE = 2**31
"""Numerator and denominator of a time base the wire carries (int32)."""
AUTH_ERRORS: tuple[type[av.error.FFmpegError], ...] = (
    av.error.HTTPUnauthorizedError,  # 401, over RTSP and HTTP alike
    av.error.HTTPForbiddenError,  # 403
)


class SourceUnavailable(SourceError):
    """The source could not be opened (down, refused, not found, timed out)."""


class SourceStalled(SourceError):
    """No packet arrived within the read timeout."""


class SourceLost(SourceError):
    """The connection ended or broke while reading."""


class SourceRefused(SourceError):
    """The source can never be used as it is (its size, its time base): FAILED, not retried."""


class SizeRefused(SourceRefused):
    """The source is smaller or larger than its size settings allow."""


class SourceAuthFailed(SourceError):
    """The source refused the credentials (401/403): retried slowly (``auth_retry_s``)."""


def scheme_of(url: str) -> str:
    """The source's network scheme, lower-cased; ``""`` for a local file (``file:`` too)."""
    return "" if local_path(url) is not None else source_scheme(url)


def _with_credentials(url: str, username: str, password: str | None) -> str:
    scheme, _, rest = url.partition("://")
    userinfo = quote(username, safe="")
    if password is not None:
        userinfo += ":" + quote(password, safe="")
    return f"{scheme}://{userinfo}@{rest}"


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """Where and how to read a stream (built from a :class:`StreamConfig`)."""

    url: str = field(repr=False)
    """The URL FFmpeg opens, credentials included: never log it, log ``display``."""
    display: str = ""
    live: bool = False
    """End of file is a disconnect (reconnect), not the end."""
    network: bool = False
    """Failures are retried (a local file that fails is FAILED at once)."""
    pace: bool = False
    """Sleep so frames come out at their PTS rate (a file simulating a camera)."""
    loop: bool = False
    open_timeout_s: float = 10.0
    read_timeout_s: float = 10.0
    options: dict[str, str] = field(default_factory=dict, repr=False)
    secrets: tuple[str, ...] = field(default=(), repr=False)
    min_size: tuple[int, int] = (1, 1)
    """Smallest usable width and height (``min_width``, ``min_height``)."""
    max_size: tuple[int, int] = (16_384, 16_384)
    """Largest usable width and height, either orientation (``max_width``, ``max_height``)."""

    @classmethod
    def from_config(cls, config: StreamConfig) -> SourceSpec:
        scheme = scheme_of(config.url)
        url = config.url
        secrets: list[str] = []
        if config.username is not None:
            if scheme not in CREDENTIAL_SCHEMES:
                raise SourceError(
                    f"username/password need an rtsp, rtmp or http(s) URL, not {scheme or 'a file'}"
                )
            password = config.password.get_secret_value() if config.password else None
            url = _with_credentials(url, config.username, password)
            if password:
                secrets += [password, quote(password, safe="")]
        secrets += secret_values(config.url)
        live = config.live if config.live is not None else scheme in LIVE_SCHEMES
        options = dict(PROTOCOL_DEFAULTS.get(scheme, {}))
        if scheme in ("rtsp", "rtsps"):
            options["rtsp_transport"] = config.rtsp_transport
        options.update(config.options)
        return cls(
            url=url,
            display=redact_url(config.url),
            live=live,
            network=scheme not in ("", "file"),
            pace=config.realtime and not live,
            loop=config.loop,
            open_timeout_s=config.open_timeout_s,
            read_timeout_s=config.read_timeout_s,
            options=options,
            secrets=tuple(s for s in secrets if s),
            min_size=(config.min_width, config.min_height),
            max_size=(config.max_width, config.max_height),
        )

    def reason(self, exc: BaseException) -> str:
        """An FFmpeg/OS error as a short, credential-free reason (without the URL it quotes)."""
        text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        return self.scrub(str(text))

    def size_problem(self, width: int, height: int) -> str | None:
        """Why a ``width`` x ``height`` source cannot be used (None: it can)."""
        (min_w, min_h), (max_w, max_h) = self.min_size, self.max_size
        if width < min_w or height < min_h:
            return f"{width}x{height} is smaller than min_width x min_height ({min_w}x{min_h})"
        if not (width <= max_w and height <= max_h) and not (width <= max_h and height <= max_w):
            return (
                f"{width}x{height} is larger than max_width x max_height ({max_w}x{max_h}, "
                "either orientation)"
            )
        return None

    def check_size(self, width: int, height: int) -> None:
        """Raise :class:`SourceRefused` if the source's size is not usable."""
        problem = self.size_problem(width, height)
        if problem is not None:
            raise SizeRefused(
                f"{self.display}: source size {problem}: refused (change the source or those "
                "settings)"
            )

    def scrub(self, text: str) -> str:
        """``text`` (an FFmpeg message, a traceback) without credentials."""
        text = text.replace(self.url, redact_url(self.url))
        for secret in sorted(self.secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return redact_text(text)


@dataclass(frozen=True, slots=True)
class Opened:
    """A session started: what the source turned out to be."""

    time_base: Fraction
    wrap_bits: int | None
    fps: float
    codec: str
    format: str
    frames: int = 0
    """The frame count the container states (0: unknown)."""
    duration_s: float | None = None
    """The video's length the container states (None: unknown, e.g. live)."""


@dataclass(frozen=True, slots=True)
class Decoded:
    """One decoded frame, stamped on the ingest clock when it left the decoder."""

    frame: av.VideoFrame
    raw_pts: int | None
    time_base: Fraction
    captured_at: float
    capture_time: float | None = None
    """When the source says it captured the frame (Unix time, its clock): see
    :func:`capture_time`; None where it does not say."""


def capture_time(
    container: av.container.InputContainer, pts: int | None, tb: Fraction
) -> float | None:
    """A frame's capture time on the camera's clock, where the source says it.

    FFmpeg's RTSP demuxer sets ``start_time_realtime`` (microseconds since the
    Unix epoch at PTS 0) from the NTP time of the first RTCP sender report;
    it is unset before that report arrives and for every other source.
    """
    realtime = container.start_time_realtime
    if realtime is None or pts is None:
        return None
    return realtime / 1_000_000 + float(pts * tb)


class AVSource:
    """A PyAV-decoded video source. One instance per stream; blocking."""

    def __init__(
        self,
        spec: SourceSpec,
        on_decode_error: Callable[[], None] | None = None,
        on_skip: Callable[[], None] | None = None,
    ) -> None:
        self.spec = spec
        self._on_error = on_decode_error or (lambda: None)
        self._on_skip = on_skip or (lambda: None)
        self.catchup: Catchup | None = None
        """The current session's lag tracker (live sources)."""
        self.large = False
        """The last session had large frames: :meth:`release` trims the C heap."""
        self.resume: ResumeAt | None = None
        """Start the next session there in a file (a stream taken over from another ingest
        replica resumes where it was); used once."""
        memory.tune()

    def session(
        self,
        stop: threading.Event,
        on_open: Callable[[Opened], None],
        on_frame: Callable[[Decoded], bool],
    ) -> None:
        """Open, decode until the end (or ``stop``, or ``on_frame`` returns False), close.

        Returns normally at the end of a non-live source and when stopped;
        raises :class:`SourceError` (a subclass says which) otherwise.
        """
        with interrupt.watching(stop):  # a stop aborts a blocking open or read at once
            container = self._open(stop)
            try:
                stream = container.streams.video[0]
                stream.thread_type = "AUTO"
                opened = self._opened(container, stream)
                on_open(opened)
                resume, self.resume = (None if self.spec.network else self.resume), None
                skip = seek(container, stream, opened.time_base, resume, self.spec.loop)
                ended = self._decode(container, stream, opened.time_base, stop, on_frame, skip)
            finally:
                container.close()
        if ended and self.spec.live and not stop.is_set():
            raise SourceLost(f"{self.spec.display} ended the stream (live source: reconnecting)")

    def release(self) -> None:
        """After a session, once nothing refers to its decoder: give large frames' memory back.

        (The caller drops the session's exception traceback first: see :func:`detached`.)
        """
        if self.large:
            self.large = False
            memory.trim()

    def _opened(self, container: av.container.InputContainer, stream: VideoStream) -> Opened:
        """What the source is; refuses a size (from the headers) or time base it cannot use."""
        ctx = stream.codec_context
        if ctx.width > 0 and ctx.height > 0:
            self.large = self.large or ctx.width * ctx.height > LARGE_FRAME_AREA
            self.spec.check_size(ctx.width, ctx.height)
        tb = Fraction(stream.time_base or Fraction(1, 90_000))
        if not (0 < tb.numerator <= MAX_TIME_BASE and 0 < tb.denominator <= MAX_TIME_BASE):
            raise SourceRefused(
                f"{self.spec.display}: time base {tb} is out of range (int32 terms): refused"
            )
        fmt = container.format.name or ""
        return Opened(
            time_base=tb,
            wrap_bits=WRAP_BITS.get(fmt.split(",")[0]),
            fps=float(stream.average_rate or stream.guessed_rate or 0.0),
            codec=ctx.name,
            format=fmt,
            frames=max(0, stream.frames or 0),
            duration_s=_duration_s(container, stream, tb),
        )

    def _auth_failed(self, exc: av.error.FFmpegError) -> SourceAuthFailed:
        return SourceAuthFailed(
            f"authentication failed: {self.spec.display}: {self.spec.reason(exc)} "
            "(check username and password)"
        )

    def _open(self, stop: threading.Event) -> av.container.InputContainer:
        spec = self.spec
        try:
            container = av.open(
                spec.url,
                options={**spec.options, "protocol_whitelist": protocols_for(spec.url)},
                timeout=(spec.open_timeout_s, spec.read_timeout_s),
            )
        except av.error.ExitError:
            if stop.is_set():
                raise SourceUnavailable(f"{spec.display}: stopped while opening") from None
            raise SourceUnavailable(
                f"cannot open {spec.display}: no answer in {spec.open_timeout_s:g} s "
                "(open_timeout_s)"
            ) from None
        except AUTH_ERRORS as exc:
            raise self._auth_failed(exc) from None
        except (av.error.FFmpegError, OSError) as exc:
            raise self._cannot_open(exc) from None
        if not container.streams.video:
            container.close()
            if not spec.network:
                raise self._cannot_open(None)
            raise SourceUnavailable(f"{spec.display} has no video stream")
        return container

    def _cannot_open(self, exc: BaseException | None) -> SourceUnavailable:
        """Why an open failed. A file's reason is the same whether it exists or not (no
        "No such file" against "Invalid data": not an oracle); the log has FFmpeg's."""
        spec = self.spec
        said = spec.reason(exc) if exc is not None else "no video stream"
        if not spec.network:
            log.warning("cannot open file source %s: %s", spec.display, said)
            return SourceUnavailable(
                f"cannot open {spec.display}: not a readable video file (missing, unreadable "
                "or holding no video: check the path, its permissions and the file)"
            )
        if isinstance(exc, av.error.ArgumentError):  # EINVAL: what protocol_whitelist says
            said += " (a protocol outside the source's allowlist, or a bad option)"
        elif isinstance(exc, av.error.InvalidDataError) and scheme_of(spec.url) in HTTP:
            said += " (not video, or an HLS playlist with segments outside http(s)://)"
        return SourceUnavailable(f"cannot open {spec.display}: {said}")

    def _decode(
        self,
        container: av.container.InputContainer,
        stream: VideoStream,
        tb: Fraction,
        stop: threading.Event,
        on_frame: Callable[[Decoded], bool],
        skip_before: ResumeAt | None = None,
    ) -> bool:
        """Decode until the end (True) or until stopped (False); frames before
        ``skip_before`` (as it is when they are decoded) are not handed on."""
        pacer = FramePacer() if self.spec.pace else None
        watch = _NoFrameWatch(self.spec)
        sizes = _SizeWatch(self)
        catchup = Catchup(tb) if self.spec.live else None
        self.catchup = catchup
        packets = container.demux(stream)
        while not stop.is_set():
            packet = self._next_packet(packets, stop)
            if packet is None:
                return not stop.is_set()
            if catchup is not None and catchup.skips(packet):
                self._on_skip()
                continue
            try:
                frames = packet.decode()
            except av.error.FFmpegError:
                self._on_error()
                frames = []
            watch.packet(len(frames))
            for frame in frames:
                sizes.check(frame)
                if skip_before is not None and frame.pts is not None:
                    if float(frame.pts * tb) < skip_before.now():
                        continue
                    skip_before = None
                if pacer is not None and frame.pts is not None:
                    pacer.wait(float(frame.pts * tb), stop)
                found = Decoded(
                    frame, frame.pts, tb, time.time(), capture_time(container, frame.pts, tb)
                )
                if not on_frame(found):
                    return False
        return False

    def _next_packet(
        self, packets: Iterator[Packet[VideoStream]], stop: threading.Event
    ) -> Packet[VideoStream] | None:
        """The next packet, None at the end; read failures become SourceErrors.

        A read that took the whole read timeout is a stall even when it returns
        a packet: on the first timeout FFmpeg's RTSP demuxer hands out what its
        depacketizer still held, and only the *next* read raises, so without
        this check a stall would be noticed after twice the read timeout.
        """
        spec = self.spec
        started = time.monotonic()
        try:
            packet = next(packets)
        except StopIteration:
            return None
        except av.error.ExitError:
            if stop.is_set():
                return None
            raise self._stalled() from None
        except AUTH_ERRORS as exc:
            raise self._auth_failed(exc) from None
        except (av.error.FFmpegError, OSError) as exc:
            if not spec.network:  # a damaged file: count it and end like EOF
                self._on_error()
                return None
            raise SourceLost(f"lost {spec.display}: {spec.reason(exc)}") from None
        if spec.network and time.monotonic() - started >= spec.read_timeout_s:
            raise self._stalled()
        return packet

    def _stalled(self) -> SourceStalled:
        spec = self.spec
        return SourceStalled(
            f"{spec.display} stalled: no data for {spec.read_timeout_s:g} s (read_timeout_s)"
        )


def _duration_s(
    container: av.container.InputContainer, stream: VideoStream, tb: Fraction
) -> float | None:
    if stream.duration and stream.duration > 0:
        return float(stream.duration * tb)
    return container.duration / 1_000_000 if container.duration else None


class _SizeWatch:
    """Checks each decoded frame's size when it changes (a camera reconfigured mid-stream)."""

    def __init__(self, source: AVSource) -> None:
        self._source = source
        self._size: tuple[int, int] | None = None

    def check(self, frame: av.VideoFrame) -> None:
        size = (frame.width, frame.height)
        if size != self._size:
            self._source.spec.check_size(*size)
            self._source.large |= size[0] * size[1] > LARGE_FRAME_AREA
            self._size = size


class _NoFrameWatch:
    """Notices a network source whose packets stopped turning into frames."""

    def __init__(self, spec: SourceSpec) -> None:
        self._spec = spec
        self._packets = 0
        self._since = time.monotonic()

    def packet(self, frames: int) -> None:
        if frames or not self._spec.network:
            self._packets, self._since = 0, time.monotonic()
            return
        self._packets += 1
        quiet = time.monotonic() - self._since
        if self._packets >= NO_FRAME_PACKETS and quiet >= self._spec.read_timeout_s:
            raise SourceLost(
                f"{self._spec.display}: {self._packets} packets in {quiet:.0f} s gave no frame "
                "(codec change or corrupt stream); reopening"
            )
