"""One ingest stream: its decode thread, counters, credit window and state.

The decode thread reads the source, stamps ``(epoch, pts)``, samples by PTS,
letterboxes and encodes, and offers the frame to a one-slot mailbox
(:class:`LatestSlot`): for live sources the newest frame replaces an unsent
one (counted as ``replaced``); for files read as fast as possible the thread
waits instead, so nothing is lost.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
import threading
from dataclasses import dataclass
from fractions import Fraction

from framerelay.credits import CreditWindow
from framerelay.errors import FramerelayError
from framerelay.timeline import Sampler, Timeline
from ingest.handoff import LatestSlot, SlotClosed
from ingest.prepare import Prepared, Preparer
from ingest.settings import StreamConfig
from ingest.source import AVSource, Decoded, Restart, SourceSpec, redact

log = logging.getLogger(__name__)
LATENCY_WINDOW = 4096


class StreamState(enum.StrEnum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RECONNECTING = "RECONNECTING"
    STOPPED = "STOPPED"
    FAILED = "FAILED"


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A prepared frame waiting for a credit."""

    seq: int
    epoch: int
    pts: int
    time_base: Fraction
    captured_at: float
    prepared: Prepared


COUNTERS = (
    "decoded", "no_pts", "sampled_out", "prepared", "sent", "results", "replaced",
    "decode_error", "encode_error", "disconnected", "timeout", "worker_error",
)  # fmt: skip


class IngestStream:
    """State of one stream on the ingest side. Create, ``start()``, ``stop()``."""

    def __init__(
        self, config: StreamConfig, loop: asyncio.AbstractEventLoop, max_inflight: int
    ) -> None:
        self.config = config
        self.id = config.id
        self.state = StreamState.STARTING
        self.error: str | None = None
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.latency_ms: collections.deque[float] = collections.deque(maxlen=LATENCY_WINDOW)
        self.window = CreditWindow(cap=max_inflight, limit=max_inflight if self.lossless else 1)
        self.credit = asyncio.Event()
        self.credit.set()
        self.slot: LatestSlot[Outgoing] = LatestSlot(loop, lossless=self.lossless)
        self.source_fps = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._preparer: Preparer | None = None
        self._seq = 0

    @property
    def lossless(self) -> bool:
        """Files read as fast as possible wait for credit instead of dropping."""
        return not self.config.realtime

    @property
    def sampling_fps(self) -> float:
        return self.config.fps if self.config.fps > 0 else self.source_fps

    @property
    def finished(self) -> bool:
        """The source ended and every frame was answered or given up."""
        done = self._thread is not None and not self._thread.is_alive()
        return done and not self.window.inflight and self.slot_empty

    @property
    def slot_empty(self) -> bool:
        return self.slot.empty()

    def start(self, input_w: int, input_h: int) -> None:
        """Start decoding (once the model input size is known)."""
        self._preparer = Preparer(input_w, input_h, self.config.jpeg_quality)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"decode-{self.id}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.slot.close()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _count(self, name: str) -> None:
        self.counters[name] += 1

    def _run(self) -> None:
        spec = SourceSpec(
            url=self.config.url,
            realtime=self.config.realtime,
            loop=self.config.loop,
            open_timeout_s=self.config.open_timeout_s,
            read_timeout_s=self.config.read_timeout_s,
        )
        source = AVSource(spec, on_decode_error=lambda: self._count("decode_error"))
        try:
            self._pump(source)
            if self.state is not StreamState.FAILED:
                self.state = StreamState.STOPPED
        except SlotClosed:
            self.state = StreamState.STOPPED
        except FramerelayError as exc:
            self.state, self.error = StreamState.FAILED, str(exc)
            log.error("stream %s failed: %s", self.id, exc)
        except Exception as exc:  # a bug must not kill other streams; report it
            self.state, self.error = StreamState.FAILED, f"{type(exc).__name__}: {exc}"
            log.exception("stream %s crashed", self.id)
        finally:
            self.slot.close()

    def _pump(self, source: AVSource) -> None:
        timeline: Timeline | None = None
        sampler = Sampler(self.config.fps)
        taken = 0
        for item in source.frames(self._stop):
            if isinstance(item, Restart):
                if timeline is not None:
                    timeline.new_epoch()
                continue
            self.state = StreamState.RUNNING
            if timeline is None:
                timeline = Timeline(item.time_base, wrap_bits=source.wrap_bits)
                self.source_fps = source.fps
            self._count("decoded")
            self._offer(item, timeline, sampler)
            taken += 1
            if self.config.max_frames and taken >= self.config.max_frames:
                return

    def _offer(self, item: Decoded, timeline: Timeline, sampler: Sampler) -> None:
        if item.raw_pts is None:
            self._count("no_pts")
            return
        epoch, pts = timeline.stamp(item.raw_pts)
        if not sampler.keep(epoch, timeline.seconds(pts)):
            self._count("sampled_out")
            return
        assert self._preparer is not None  # noqa: S101 - set by start()
        try:
            prepared = self._preparer.prepare(item.frame)
        except (ValueError, OSError) as exc:
            self._count("encode_error")
            log.debug("encode error on %s: %s", self.id, exc)
            return
        self._count("prepared")
        out = Outgoing(self._seq, epoch, pts, item.time_base, item.captured_at, prepared)
        self._seq += 1
        if self.slot.put(out) is not None:
            self._count("replaced")

    def describe(self) -> dict[str, object]:
        """State and counters, for the API, the progress line and metrics."""
        return {
            "id": self.id,
            "source": redact(self.config.url),
            "state": self.state.value,
            "error": self.error,
            "credits": self.window.limit,
            "inflight": len(self.window.inflight),
            **self.counters,
        }
