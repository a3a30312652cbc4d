"""End-to-end latency of one stream, its histogram and its SLO breaches.

A result's latency is measured from the frame's *capture* where the source
says when it captured it, else from its *decode* on the ingest:

* RTSP: FFmpeg's RTSP demuxer sets ``start_time_realtime`` (the wall clock
  of PTS 0) from the NTP time of the first RTCP sender report, so a frame's
  capture time is that plus its PTS (:func:`ingest.source.capture_time`).
  It is the camera's clock: an unsynchronised camera skews the figure by
  its clock error. Until the first sender report arrives (a few seconds
  after the stream opens), and for sources that send none, the decode time
  stands in;
* everything else (files, HTTP, HLS, RTMP): the decode time, ``captured_at``.

``captured_at`` itself stays the decode time on the ingest clock (the wire's
contract, used by the tracker and the recorder); the capture-to-decode delay
of each frame sent is remembered here, by ``(epoch, seq)``, until its result
comes back. :attr:`StreamLatency.source` says which clock the last result was
measured from (``latency_from`` in the stream's status).

Every result updates a histogram (``BUCKETS_S``) read at scrape time by
:mod:`ingest.metrics`, and counts a breach when ``latency_slo_ms`` is set and
exceeded.
"""

from __future__ import annotations

import bisect
import collections
import enum
import logging
import threading

import numpy as np

from framerelay.results import ResultRecord
from framerelay.wire import Timing
from ingest.window import FloatWindow

log = logging.getLogger(__name__)
LATENCY_WINDOW = 4096
"""Latencies kept per stream (the progress line, the history, the status)."""
RECENT = 256
"""The status's p50/p99 are of this many newest results."""
BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
    20.0, 30.0,
)  # fmt: skip
"""Upper bounds of the latency histogram, 10 ms .. 30 s (then +Inf)."""
PENDING = 256
"""Frames sent with a capture time and not answered yet, at most (oldest forgotten first;
more than ``max_inflight`` plus the mailbox, the most that can wait for a result)."""
MAX_CAPTURE_LAG_S = 300.0
MAX_AHEAD_S = 0.25
"""A capture time more than this ahead of the decode, or ``MAX_CAPTURE_LAG_S`` behind it,
is not believed (a camera clock far off): the decode time stands in."""


class LatencyFrom(enum.StrEnum):
    CAPTURE = "capture"
    """From the source's own capture time (RTSP: RTCP sender reports)."""
    DECODE = "decode"
    """From the decode on the ingest (``captured_at``)."""


class StreamLatency:
    """Latency of one stream's results: window, histogram, SLO breaches.

    :meth:`sent` runs in the decode thread, :meth:`observe` in the event loop,
    :meth:`histogram` in whatever thread scrapes.
    """

    def __init__(self, slo_ms: float | None, window: int = LATENCY_WINDOW) -> None:
        self.slo_ms = slo_ms
        self.window = FloatWindow(window)
        """End-to-end latencies in ms, newest last."""
        self.source = LatencyFrom.DECODE
        """The clock the last result's latency was measured from."""
        self.breaches = 0
        self.sum_s = 0.0
        self._counts = [0] * (len(BUCKETS_S) + 1)  # per bucket, not cumulative; last: +Inf
        self._lags: collections.OrderedDict[tuple[int, int], float] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._warned = False
        self._observed = 0
        self._percentiles: tuple[int, float | None, float | None] = (0, None, None)
        """(results seen, p50, p99) when last computed: a console reads every stream every
        second, and the percentiles only change when a result came."""

    def sent(self, timing: Timing, capture_time: float | None) -> None:
        """A frame goes out: remember how long after its capture it was decoded."""
        if capture_time is None:
            return
        lag = timing.captured_at - capture_time
        if not -MAX_AHEAD_S <= lag <= MAX_CAPTURE_LAG_S:
            self._distrust(lag)
            return
        with self._lock:
            self._lags[(timing.epoch, timing.seq)] = lag
            if len(self._lags) > PENDING:
                self._lags.popitem(last=False)

    def observe(self, record: ResultRecord) -> float:
        """A result came back: its end-to-end latency in ms (counted, and returned)."""
        with self._lock:
            lag = self._lags.pop((record.epoch, record.seq), None)
        self.source = LatencyFrom.DECODE if lag is None else LatencyFrom.CAPTURE
        ms = record.latency_ms + (0.0 if lag is None else lag * 1000)
        self.window.append(ms)
        self._observed += 1
        self._counts[bisect.bisect_left(BUCKETS_S, ms / 1000)] += 1
        self.sum_s += ms / 1000
        if self.slo_ms is not None and ms > self.slo_ms:
            self.breaches += 1
        return ms

    def histogram(self) -> tuple[list[tuple[str, float]], float]:
        """``([(le, cumulative count)...], sum in seconds)``, ``+Inf`` last."""
        counts, total = list(self._counts), self.sum_s
        buckets, running = [], 0
        for bound, n in zip((*map(str, BUCKETS_S), "+Inf"), counts, strict=True):
            running += n
            buckets.append((bound, float(running)))
        return buckets, total

    def describe(self) -> dict[str, object]:
        """For the stream's status: the SLO, the clock, breaches and recent percentiles."""
        p50, p99 = self._recent_percentiles()
        return {
            "latency_slo_ms": self.slo_ms,
            "latency_from": self.source.value,
            "latency_p50_ms": p50,
            "latency_p99_ms": p99,
            "slo_breaches": self.breaches,
        }

    def _recent_percentiles(self) -> tuple[float | None, float | None]:
        seen, p50, p99 = self._percentiles
        if seen == self._observed:
            return p50, p99
        recent = self.window.last(RECENT)
        p50 = p99 = None
        if recent:
            q = np.percentile(np.asarray(recent, dtype=np.float64), (50, 99))
            p50, p99 = round(float(q[0]), 3), round(float(q[1]), 3)
        self._percentiles = (self._observed, p50, p99)
        return p50, p99

    def _distrust(self, lag: float) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "the source's capture clock is %.1f s %s the ingest's: latency is measured "
                "from the decode instead (is the camera's clock synchronised?)",
                abs(lag), "behind" if lag > 0 else "ahead of",
            )  # fmt: skip
