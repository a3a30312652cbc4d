"""One ingest stream: its decode thread, state machine, counters and credit window.

The decode thread keeps the source running (:mod:`ingest.reconnect`), stamps
``(epoch, pts)`` (within the epoch budget, :mod:`framerelay.timeline`),
samples by PTS (live sources also by wall clock), letterboxes and encodes, and offers the
frame to a one-slot mailbox (:class:`LatestSlot`): for live sources the newest
frame replaces an unsent one; for files read as fast as possible the thread
waits instead, so nothing is lost.

States: ``STARTING`` (first open) -> ``RUNNING`` (frames decode) ->
``RECONNECTING`` (a failure; waiting out the backoff or opening again) ->
``RUNNING`` ... ; ``STALLED`` (decoding, but the worker's tunnel stopped answering:
see :meth:`IngestStream.stall`); ``AUTH_FAILED`` (the camera refused the
credentials: retried every ``auth_retry_s``); and finally ``STOPPED`` (stopped, removed,
the file ended, ``max_frames``) or ``FAILED`` (a file that cannot be read, a source
of unusable size, ``max_retries`` exhausted, a bug; ``error`` says why).

Counters (one per reason, every frame lands in exactly one outcome):
``decoded``; ``no_pts`` (no timestamp: cannot be placed in time, dropped);
``sampled_out`` (above the target fps); ``no_credit`` (live: no worker
connected, dropped before encoding); ``prepared`` (encoded) of which
``replaced`` (superseded in the mailbox by a newer frame while waiting for a
credit: the worker or the network is slower than the sampling rate) and
``sent``; after sending ``results``, ``disconnected``, ``timeout``,
``worker_error``. Failures: ``decode_error`` (packets the decoder rejected,
skipped), ``corrupt`` (frames the decoder flagged as damaged and concealed;
kept and counted), ``behind`` (live: packets dropped undecoded to catch up
with the source, see :class:`ingest.catchup.Catchup`), ``encode_error``,
``open_error``, ``stall`` (read timeout), ``source_lost`` (disconnect, live
end-of-file), ``reconnects``, ``auth_failed`` (the camera answered 401/403),
``size_refused`` (the source's size is outside min/max_width/height: FAILED),
``corrupt_timestamps`` (PTS discontinuities over ``max_epochs_per_min``: not
new epochs; frames are sampled in decode order meanwhile), ``out_of_range``
(a frame the wire cannot carry, e.g. a letterbox scale above 64 or a PTS beyond
2^62: dropped before encoding).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
import traceback
from collections.abc import Callable

from framerelay import wire
from framerelay.backoff import Backoff
from framerelay.credits import CreditWindow
from framerelay.errors import FramerelayError, SourceError
from framerelay.timeline import (
    BUDGET_WINDOW_S,
    EpochBudget,
    FrameClock,
    Sampler,
    Timeline,
    frame_ticks,
)
from framerelay.wire import Timing
from ingest.console_frames import SentFrames
from ingest.handoff import LatestSlot, SlotClosed
from ingest.job_ledger import JobReader
from ingest.latency import StreamLatency
from ingest.prepare import Prepared, Preparer, Unsendable
from ingest.reconnect import SourceRunner
from ingest.resume import ResumeAt
from ingest.settings import StreamConfig
from ingest.source import (
    AVSource,
    Decoded,
    Opened,
    SizeRefused,
    SourceAuthFailed,
    SourceLost,
    SourceSpec,
    SourceStalled,
)
from ingest.stream_state import COUNTERS as COUNTERS  # re-exported: the stream's vocabulary
from ingest.stream_state import Outgoing as Outgoing
from ingest.stream_state import StreamState as StreamState

log = logging.getLogger(__name__)
HISTORY = 32
NO_PTS_WARN_AFTER = 50
CORRUPT_TIMESTAMPS = "corrupt_timestamps"


class IngestStream:
    """State of one stream on the ingest side. Create, ``launch()``/``start()``, ``stop()``.

    ``link_up`` tells the decode thread whether a worker is connected (live frames are
    not encoded when none is). ``first_epoch`` lets a replaced definition continue its
    epochs."""

    def __init__(
        self,
        config: StreamConfig,
        loop: asyncio.AbstractEventLoop,
        max_inflight: int,
        *,
        link_up: Callable[[], bool] | None = None,
        first_epoch: int = 0,
        resume: ResumeAt | None = None,
    ) -> None:
        self.config = config
        self.id = config.id
        self.spec = SourceSpec.from_config(config)
        self.state = StreamState.STARTING
        self.state_since = time.time()
        self.history: collections.deque[dict[str, object]] = collections.deque(maxlen=HISTORY)
        self.error: str | None = None
        """What is wrong now (RECONNECTING, FAILED); cleared when frames flow again."""
        self.last_error: str | None = None
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.latency = StreamLatency(config.latency_slo_ms)
        self.latency_ms = self.latency.window
        self.window = CreditWindow(cap=max_inflight, limit=max_inflight if self.lossless else 1)
        self.credit = asyncio.Event()
        self.credit.set()
        self.slot: LatestSlot[Outgoing] = LatestSlot(loop, lossless=self.lossless)
        self.source_fps = 0.0
        self.source_info: Opened | None = None
        self.last_frame_at: float | None = None
        self.retry_delay_s: float | None = None
        """The backoff delay of the last failure (RECONNECTING: the wait before this attempt)."""
        self.sender_idle = asyncio.Event()
        """Set while no tunnel sender task serves this stream (a sender sends CLOSE as it ends)."""
        self.sender_idle.set()
        self.timeline: Timeline | None = None
        self._first_epoch = first_epoch
        self._link_up = link_up or (lambda: True)
        self._init_decoding(config, resume)
        self.stalled: str | None = None
        """Why the worker serving this stream stopped answering (None: it answers)."""
        self.sent_frames: SentFrames | None = None
        """The frames sent lately, kept while the console's live view watches this stream."""
        self._failure: str | None = None
        """Why :meth:`fail` failed this stream (the decode thread must not undo it)."""
        self.job: JobReader | None = None
        """A batch job's task (:mod:`ingest.job_task`): sampling, checkpoint, rereads."""
        self._record(StreamState.STARTING, "created")

    def _init_decoding(self, config: StreamConfig, resume: ResumeAt | None) -> None:
        """The decode thread's state: its source, sampler, encoder and epoch budget."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._input_size: tuple[int, int] | None = None
        self._size_known = threading.Event()
        self._preparer: Preparer | None = None
        self._sampler = Sampler(config.fps)
        self._budget = EpochBudget(config.max_epochs_per_min, BUDGET_WINDOW_S)
        self._frames = FrameClock()
        """Decode-order time: the clock of the rate bound and of the epoch budget for files
        read as fast as possible (live sources use the wall clock)."""
        self._resume = resume
        """Where a file starts (a stream taken over from another replica)."""
        self._seq = self._taken = 0
        self._source: AVSource | None = None

    @property
    def lossless(self) -> bool:
        """Files read as fast as possible wait for credit instead of dropping."""
        return not self.config.realtime and not self.spec.live

    @property
    def sampling_fps(self) -> float:
        return self.config.fps if self.config.fps > 0 else self.source_fps

    @property
    def epoch(self) -> int:
        return self.timeline.epoch if self.timeline is not None else self._first_epoch

    @property
    def finished(self) -> bool:
        """The source ended and every frame was answered or given up."""
        done = self._thread is not None and not self._thread.is_alive()
        return done and not self.window.inflight and self.slot_empty

    @property
    def slot_empty(self) -> bool:
        return self.slot.empty()

    @property
    def lag_s(self) -> float | None:
        """Live sources: how far decoding is behind the source's own clock."""
        source = self._source  # the decode thread drops it when it ends
        catchup = source.catchup if source is not None else None
        return None if catchup is None else catchup.lag_s

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def launch(self) -> None:
        """Start reading the source (frames are encoded once the model size is known)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"decode-{self.id}", daemon=True)
            self._thread.start()

    def start(self, input_w: int, input_h: int) -> None:
        """A worker is connected: encode for its model input size (and launch)."""
        self._input_size = (input_w, input_h)
        self._size_known.set()
        self.launch()

    def stop(self) -> None:
        self._stop.set()
        self.slot.close()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def fail(self, reason: str) -> None:
        """Fail this stream only (e.g. its sender hit a bug): FAILED with ``reason``, stopped.
        Safe from the event loop; the decode thread ends at its next frame, and the stream
        stays FAILED whatever that thread was doing meanwhile."""
        self._failure = reason
        self._failed(reason)
        self.stop()

    def stall(self, reason: str) -> None:
        """The tunnel serving this stream stalled: ``STALLED`` until :meth:`unstall`."""
        self.stalled = reason
        if self.state in (StreamState.STARTING, StreamState.RUNNING):
            self.error = self.last_error = reason
            self._record(StreamState.STALLED, reason)

    def unstall(self, reason: str = "worker answers again") -> None:
        """Results flow again (same worker after a pause, or another one: ``reason``
        says which)."""
        self.stalled = None
        if self.state is StreamState.STALLED:
            self.error = None
            self._record(StreamState.RUNNING, reason)

    def sender_started(self) -> None:
        """Called by the tunnel client (event loop) when a sender task starts serving us."""
        self.sender_idle.clear()

    def sender_stopped(self) -> None:
        """Called by the tunnel client when that task ends (after CLOSE, or cancelled)."""
        self.sender_idle.set()

    def _count(self, name: str) -> None:
        self.counters[name] += 1

    def _record(self, state: StreamState, reason: str) -> None:
        now = time.time()
        if state is not self.state:
            log.info("stream %s: %s -> %s (%s)", self.id, self.state.value, state.value, reason)
            self.state, self.state_since = state, now
        self.history.append({"at": now, "state": state.value, "reason": reason})

    # -- decode thread ------------------------------------------------------

    def _runner(self, resume: ResumeAt | None = None) -> SourceRunner:
        source = AVSource(
            self.spec,
            on_decode_error=lambda: self._count("decode_error"),
            on_skip=lambda: self._count("behind"),
        )
        source.resume, self._resume = resume or self._resume, None
        if self._source is not None:  # a job task's earlier pass
            self._source.release()
        self._source = source
        cfg = self.config
        return SourceRunner(
            source,
            self,
            self._stop,
            backoff=Backoff(
                cfg.reconnect_initial_s, max(cfg.reconnect_max_s, cfg.reconnect_initial_s)
            ),
            healthy_after_s=cfg.healthy_after_s,
            max_retries=cfg.max_retries,
            auth_retry_s=cfg.auth_retry_s,
        )

    def _run(self) -> None:
        """The decode thread: whatever goes wrong fails this stream only, with a message."""
        try:
            if self.job is None:
                self._runner().run()
            else:
                self.job.read(lambda at: self._runner(at).run(), self._stop)
            self._stopped("stopped" if self._stop.is_set() else "source ended")
        except SlotClosed:
            self._stopped("stopped")
        except FramerelayError as exc:
            if isinstance(exc, SizeRefused):
                self._count("size_refused")
            self._failed(str(exc))
        except Exception as exc:  # a bug must not kill other streams; report it
            self._failed(f"{type(exc).__name__}: {exc}")
            trace = self.spec.scrub("".join(traceback.format_exception(exc)))
            log.error("stream %s crashed:\n%s", self.id, trace)
        finally:
            self.slot.close()
            # the source's callbacks point back at this stream: drop it (no cycle left for
            # the collector) and the scaler and canvases now, not at the next full pass
            source, self._source, self._preparer = self._source, None, None
            if source is not None:
                source.release()

    def _stopped(self, reason: str) -> None:
        if self._failure is None:
            self._record(StreamState.STOPPED, reason)
        elif self.state is not StreamState.FAILED:  # a frame was decoded after fail()
            self._failed(self._failure)

    def _failed(self, reason: str) -> None:
        self.error = self.last_error = self.spec.scrub(reason)
        self._record(StreamState.FAILED, self.error)
        log.error("stream %s failed: %s", self.id, self.error)

    def on_open(self, opened: Opened) -> None:
        """Runner hook: a session opened. Every session after the first is a new epoch."""
        tl = self.timeline
        step = frame_ticks(opened.fps, opened.time_base)
        if tl is not None and (tl.time_base, tl.wrap_bits) == (opened.time_base, opened.wrap_bits):
            tl.new_epoch()
            tl.step = step
        else:  # the first session, or another clock: a new timeline, epochs continue
            if tl is not None:
                self._budget.spend(self._clock())
            self.timeline = Timeline(
                opened.time_base,
                opened.wrap_bits,
                epoch=self._first_epoch if tl is None else tl.epoch + 1,
                budget=self._budget if self.job is None else None,  # a job keeps its file's PTS
                step=step,
            )
        self._sampler.step_s = self._frames.step_s = float(step * opened.time_base)
        self.source_info = opened
        self.source_fps = opened.fps

    def on_retry(self, error: SourceError, delay_s: float) -> None:
        """Runner hook: a session failed; another attempt in ``delay_s``."""
        state = StreamState.RECONNECTING
        if isinstance(error, SourceAuthFailed):
            self._count("auth_failed")
            state = StreamState.AUTH_FAILED
        elif isinstance(error, SourceStalled):
            self._count("stall")
        elif isinstance(error, SourceLost):
            self._count("source_lost")
        else:
            self._count("open_error")
        self._count("reconnects")
        self.retry_delay_s = delay_s
        self.error = self.last_error = self.spec.scrub(str(error))
        if self.state is not state:
            self._record(state, self.error)
        log.warning("stream %s: %s; retrying in %.1f s", self.id, self.error, delay_s)

    def on_frame(self, item: Decoded) -> bool:
        """Runner hook: one decoded frame. False once ``max_frames`` is reached, or stopped."""
        if self._stop.is_set():
            return False
        self.last_frame_at = time.monotonic()
        if self.state is not StreamState.RUNNING and self.stalled is None:
            self.error = None
            self._record(StreamState.RUNNING, "decoding")
        self._count("decoded")
        if item.frame.is_corrupt:
            self._count("corrupt")
        self._offer(item)
        self._taken += 1
        return not (self.config.max_frames and self._taken >= self.config.max_frames)

    def _offer(self, item: Decoded) -> None:
        timeline = self.timeline
        if item.raw_pts is None or timeline is None:
            self._frames.tick()
            self._count("no_pts")
            if self.counters["no_pts"] == self.counters["decoded"] == NO_PTS_WARN_AFTER:
                log.warning(
                    "stream %s: %d frames and none has a timestamp (a raw elementary stream?); "
                    "frames without PTS are dropped: remux the source to MPEG-TS, MP4 or MKV",
                    self.id,
                    NO_PTS_WARN_AFTER,
                )
            return
        epoch, pts = self._stamp(timeline, item.raw_pts)
        t = timeline.seconds(pts)
        self._frames.tick(epoch, t)
        timing = self._timing(epoch, pts, item)
        if timing is None:
            return
        job = self.job  # a job task samples by its own rule, from its checkpoint
        if not (job.wants(pts, timeline) if job else self._sampler.keep(epoch, t, self._clock())):
            self._count("sampled_out")
            return
        preparer = self._ready_preparer()
        if preparer is None:
            self._count("no_credit")
            return
        prepared = self._prepare(preparer, item)
        if prepared is None:
            return
        self._count("prepared")
        out = Outgoing(timing, prepared)
        self.latency.sent(timing, item.capture_time)
        self._seq += 1
        if self.job is not None:  # pending before the sender can take it
            self.job.offered(pts)
        if self.slot.put(out) is not None:
            self._count("replaced")

    def _timing(self, epoch: int, pts: int, item: Decoded) -> Timing | None:
        """The timing of the next frame sent; None (counted) when the wire refuses it."""
        tb = item.time_base
        try:
            return wire.build(
                Timing,
                stream_id=self.id, epoch=epoch, seq=self._seq, pts=pts,
                time_base=(tb.numerator, tb.denominator), captured_at=item.captured_at,
            )  # fmt: skip
        except wire.InvalidMessage as exc:
            self._count("out_of_range")
            log.debug("frame of %s dropped: %s", self.id, exc)
            return None

    def _clock(self) -> float:
        """The rate bound's and epoch budget's clock: wall time (live), decode order (files)."""
        return self._frames.now if self.lossless else time.monotonic()

    def _stamp(self, timeline: Timeline, raw_pts: int) -> tuple[int, int]:
        """``(epoch, pts)``; discontinuities over the epoch budget are counted and reported."""
        corrupt, ordered = timeline.corrupt, timeline.decode_order
        now = self._clock()
        stamped = timeline.stamp(raw_pts, now)
        if timeline.corrupt > corrupt:
            self.counters[CORRUPT_TIMESTAMPS] += timeline.corrupt - corrupt
            self.error = self.last_error = (
                f"{CORRUPT_TIMESTAMPS}: {self._budget.count(now)} discontinuities in "
                f"{BUDGET_WINDOW_S:g} s; sampling in decode order"
            )
            if not ordered:
                log.warning("stream %s: %s", self.id, self.error)
        elif ordered and not timeline.decode_order:
            log.info("stream %s: timestamps usable again (epoch %d)", self.id, timeline.epoch)
            if self.error is not None and self.error.startswith(CORRUPT_TIMESTAMPS):
                self.error = None
        return stamped

    def _prepare(self, preparer: Preparer, item: Decoded) -> Prepared | None:
        try:
            return preparer.prepare(item.frame)
        except Unsendable as exc:
            self._count("out_of_range")
            log.debug("frame of %s dropped: %s", self.id, exc)
        except (ValueError, OSError) as exc:
            self._count("encode_error")
            log.debug("encode error on %s: %s", self.id, exc)
        return None

    def _ready_preparer(self) -> Preparer | None:
        """The encoder for the worker's input size; None (live) when no worker is there.

        Files read as fast as possible wait for the worker instead.
        """
        if self.lossless:
            while not self._size_known.wait(0.5):
                if self._stop.is_set():
                    raise SlotClosed
        elif not self._size_known.is_set() or not self._link_up():
            return None
        size = self._input_size
        assert size is not None  # noqa: S101 - set before _size_known
        if self._preparer is None or (self._preparer.input_w, self._preparer.input_h) != size:
            self._preparer = Preparer(size[0], size[1], self.config.jpeg_quality)
        return self._preparer

    # -- reporting ----------------------------------------------------------

    def describe(self) -> dict[str, object]:
        """State and counters, for the API, the progress line and metrics."""
        info = self.source_info
        age = None if self.last_frame_at is None else time.monotonic() - self.last_frame_at
        return {
            "id": self.id,
            "source": self.spec.display,
            "state": self.state.value,
            "state_since": self.state_since,
            "error": self.error,
            "last_error": self.last_error,
            "epoch": self.epoch,
            "codec": info.codec if info else None,
            "source_fps": round(self.source_fps, 3),
            "last_frame_age_s": None if age is None else round(age, 3),
            "lag_s": None if self.lag_s is None else round(self.lag_s, 3),
            "credits": self.window.limit,
            "inflight": len(self.window.inflight),
            **self.latency.describe(),
            **self.counters,
        }
