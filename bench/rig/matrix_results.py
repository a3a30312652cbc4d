"""What the fault matrix and the soak measure: a subscriber of the ingest's results
WebSocket, the healthy streams' windows (rate, p99 latency, worst result) and a
scenario's figures, with the rules they are judged by (:class:`Figures`).
:mod:`bench.rig.matrix_harness` runs the services and the scenarios."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from websockets.asyncio.client import connect

from bench.rig.common import TIMEOUT_FACTOR

LATENCY_FLOOR_MS = 50.0 * TIMEOUT_FACTOR
"""p99 during a fault may be max(2 x p99 before, p99 before + this): a floor so that a
tiny baseline on a noisy 2-core box does not flake (50 ms, x2 in CI)."""
KEPT_MIN_PCT = 95.0
RSS_SLACK_MB = 20.0


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str) -> float:
    """Poll ``predicate`` (every 0.1 s, timeout scaled by TIMEOUT_FACTOR) until truthy;
    returns the seconds it took."""
    start = time.monotonic()
    deadline = start + timeout_s * TIMEOUT_FACTOR
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s * TIMEOUT_FACTOR:.0f} s")
        time.sleep(0.1)
    return time.monotonic() - start


# -- the results subscriber ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Seen:
    stream: str
    captured_at: float
    received_at: float
    frames_ahead: float = math.nan
    """The worker's ``frames_ahead`` timing: frames it served between this one's queueing
    and this one (NaN where the result has none)."""

    @property
    def latency_ms(self) -> float:
        return (self.received_at - self.captured_at) * 1000


class Subscriber:
    """``WS /v1/results`` (every stream) in a thread of its own; reconnects if dropped."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self._token = url, token
        self.seen: list[Seen] = []
        self.connects = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="subscriber", daemon=True)

    def start(self) -> Subscriber:
        self._thread.start()
        wait_until(lambda: self._stop is not None, 10, "subscriber loop")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def snapshot(self) -> list[Seen]:
        with self._lock:
            return list(self.seen)

    def trim(self, before: float) -> None:
        """Forget results captured before ``before`` (a long soak keeps memory flat)."""
        with self._lock:
            self.seen = [s for s in self.seen if s.captured_at >= before]

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        while not self._stop.is_set():
            with contextlib.suppress(OSError, Exception):
                await self._listen(self._stop)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.5)

    async def _listen(self, stop: asyncio.Event) -> None:
        headers = {"Authorization": f"Bearer {self._token}"}
        async with connect(self.url, additional_headers=headers, proxy=None,
                           compression=None, max_size=None) as ws:  # fmt: skip
            self.connects += 1
            closing = asyncio.create_task(stop.wait())
            try:
                while not stop.is_set():
                    recv = asyncio.create_task(ws.recv())
                    await asyncio.wait({recv, closing}, return_when=asyncio.FIRST_COMPLETED)
                    if not recv.done():
                        recv.cancel()
                        return
                    self._record(recv.result(), time.time())
            finally:
                closing.cancel()

    def _record(self, raw: str | bytes, at: float) -> None:
        msg = json.loads(raw)
        if msg.get("type") == "result":
            with self._lock:
                ahead = float(msg.get("timings", {}).get("frames_ahead", math.nan))
                self.seen.append(Seen(msg["stream_id"], float(msg["captured_at"]), at, ahead))


# -- windows and figures ---------------------------------------------------------------


def p99(values: list[float]) -> float:
    """99th percentile, interpolated between the closest ranks as ``numpy.percentile``
    computes it (and the overload rig and ``bench/gpu.py``); NaN for no values. A fault's
    window holds ~36 results: the nearest-rank p99 of those is their maximum, one VM stall
    (a CI run: one result at 128 ms among 36 with p99 25 ms before), where this weighs the
    worst result at 65 % and the second-worst at 35 %; :attr:`Window.worst_ms` is shown
    beside it."""
    if not values:
        return math.nan
    return float(np.percentile(values, 99))


@dataclass(frozen=True, slots=True)
class Window:
    """A healthy stream's results captured in ``[t0, t1)``: how many, when the first and
    the last were captured, and their latency's p99."""

    results: int
    span_s: float
    p99_ms: float
    first_s: float = math.nan
    """Seconds from ``t0`` to the first result's capture."""
    last_s: float = math.nan
    """Seconds from ``t0`` to the last result's capture."""
    worst_ms: float = math.nan
    """The window's highest latency."""
    most_ahead: float = math.nan
    """The most frames the worker served ahead of one of the window's results."""

    @property
    def rate(self) -> float:
        """Results per second: one over the mean interval between the window's results
        when they reach both ends of it (no window-edge quantisation: a sampled stream's
        window of ~30 results holds one more or one fewer by where its edges fall, 3 %),
        else (a stream that starts late or stops early) results over the whole span."""
        if self.results < 3 or self.span_s <= 0:
            return self.results / self.span_s if self.span_s > 0 else 0.0
        interval = (self.last_s - self.first_s) / (self.results - 1)
        edges = max(self.first_s, self.span_s - self.last_s)
        if interval <= 0 or edges > 2 * interval:
            return self.results / self.span_s
        return 1.0 / interval


def window(seen: list[Seen], stream: str, t0: float, t1: float) -> Window:
    mine = [s for s in seen if s.stream == stream and t0 <= s.captured_at < t1]
    if not mine:
        return Window(0, t1 - t0, math.nan)
    times, latencies = [s.captured_at for s in mine], [s.latency_ms for s in mine]
    ahead = max((s.frames_ahead for s in mine if not math.isnan(s.frames_ahead)), default=math.nan)
    return Window(
        len(mine), t1 - t0, p99(latencies), min(times) - t0, max(times) - t0, max(latencies), ahead
    )


@dataclass(frozen=True, slots=True)
class HealthyFigures:
    stream: str
    before: Window
    during: Window
    latency_factor: float | None = 2.0
    """p99 during the fault may be this many times the p99 before (or that + the floor);
    None: printed, not judged."""
    kept_min_pct: float = KEPT_MIN_PCT
    """The result rate during the fault must be at least this share of the rate before."""

    @property
    def kept_pct(self) -> float:
        return 100.0 * self.during.rate / self.before.rate if self.before.rate else 0.0

    @property
    def bound_ms(self) -> float:
        """The p99 bound (infinite where latency is not judged)."""
        if self.latency_factor is None:
            return math.inf
        return max(self.latency_factor * self.before.p99_ms, self.before.p99_ms + LATENCY_FLOOR_MS)

    def problems(self) -> list[str]:
        out = []
        if not self.kept_pct >= self.kept_min_pct:
            out.append(
                f"{self.stream}: kept {self.kept_pct:.1f} % of its results "
                f"(< {self.kept_min_pct:.0f} %)"
            )
        if not self.during.p99_ms <= self.bound_ms:
            out.append(f"{self.stream}: p99 {self.during.p99_ms:.0f} ms > {self.bound_ms:.0f} ms")
        return out

    def line(self) -> str:
        b, d = self.before, self.during
        return (
            f"  {self.stream}: kept {self.kept_pct:.1f} % ({b.rate:.2f} -> {d.rate:.2f}/s, "
            f"{d.results} results), p99 {b.p99_ms:.0f} -> {d.p99_ms:.0f} ms "
            f"(bound {self.bound_ms:.0f}; worst {b.worst_ms:.0f} -> "
            f"{d.worst_ms:.0f}), frames ahead at most {b.most_ahead:.0f} -> "
            f"{d.most_ahead:.0f}"
        )


@dataclass
class Figures:
    """One scenario: healthy streams >= 95 % of their results and p99 <= the bound;
    every process alive; RSS back within 20 MB of its level before the fault."""

    name: str
    healthy: list[HealthyFigures]
    bad: dict[str, Any]
    rss_before: dict[str, float]
    rss_after: dict[str, float]
    alive: dict[str, bool]
    seconds: float
    rss_settle_s: float = 0.0

    def problems(self) -> list[str]:
        out = [p for h in self.healthy for p in h.problems()]
        out += [f"process {name} exited" for name, ok in self.alive.items() if not ok]
        for name, before in self.rss_before.items():
            after = self.rss_after.get(name, math.nan)
            if not after <= before + RSS_SLACK_MB:
                out.append(f"{name}: RSS {before:.0f} -> {after:.0f} MB (> +{RSS_SLACK_MB:.0f})")
        return out

    def report(self) -> str:
        lines = [f"\n== {self.name} ({self.seconds:.1f} s)"]
        lines += [h.line() for h in self.healthy]
        lines += [f"  bad: {k}: {v}" for k, v in self.bad.items()]
        rss = ", ".join(
            f"{n} {b:.0f}->{self.rss_after.get(n, math.nan):.0f}"
            for n, b in self.rss_before.items()
        )
        lines.append(f"  RSS MB: {rss} (settled in {self.rss_settle_s:.1f} s)")
        lines.append(f"  alive: {', '.join(n for n, ok in self.alive.items() if ok)}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "seconds": self.seconds, "bad": self.bad,
            "healthy": {h.stream: {"kept_pct": h.kept_pct, "p99_before_ms": h.before.p99_ms,
                                   "p99_during_ms": h.during.p99_ms, "bound_ms": h.bound_ms,
                                   "worst_during_ms": h.during.worst_ms,
                                   "results": h.during.results} for h in self.healthy},
            "rss_before_mb": self.rss_before, "rss_after_mb": self.rss_after,
            "alive": self.alive, "problems": self.problems(),
        }  # fmt: skip
