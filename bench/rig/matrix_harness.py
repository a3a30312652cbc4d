"""The rig of the fault matrix and the soak: real services as processes on 127.0.0.1.

* GPU workers (``framerelay worker`` on CPU, the real ONNX model, one thread each);
* one ``framerelay ingest`` process with its API (tokens minted with the shared
  HS256 secret), its default worker the first one;
* healthy streams: the sample clip played in real time, looped, at a few fps;
* a subscriber of the ingest's results WebSocket (``results:*``), recording per
  result its stream, ``captured_at`` and when it arrived;
* RSS of every process from ``/proc/<pid>/status``.

:func:`run_scenario` measures one fault: the healthy streams' results and p99
latency in a window before it and during/after it, the bad side's outcome,
and RSS before and after (see :class:`Figures` for the rules).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from websockets.asyncio.client import connect

from bench.rig.common import CLIP, MODEL, ROOT, TIMEOUT_FACTOR, free_port, mint
from framerelay.launcher import LocalWorker

SCOPES = ("streams:read", "streams:write", "routing:write", "results:*", "metrics:read")
LATENCY_FLOOR_MS = 50.0 * TIMEOUT_FACTOR
"""p99 during a fault may be max(2 x p99 before, p99 before + this): a floor so that a
tiny baseline on a noisy 2-core box does not flake (50 ms, x2 in CI)."""
KEPT_MIN_PCT = 95.0
RSS_SLACK_MB = 20.0
TOKEN_TTL_S = 6 * 3600.0
SETUP_SETTLE_S = 3.0
"""After a scenario's setup (a worker started, a victim placed), before the baseline."""


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MB (VmRSS); NaN when it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def healthy_config(stream_id: str, fps: float) -> dict[str, Any]:
    return {"id": stream_id, "url": str(CLIP), "fps": fps, "realtime": True, "loop": True}


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
                self.seen.append(Seen(msg["stream_id"], float(msg["captured_at"]), at))


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
    return Window(len(mine), t1 - t0, p99(latencies),
                  min(times) - t0, max(times) - t0, max(latencies))  # fmt: skip


@dataclass(frozen=True, slots=True)
class HealthyFigures:
    stream: str
    before: Window
    during: Window

    @property
    def kept_pct(self) -> float:
        return 100.0 * self.during.rate / self.before.rate if self.before.rate else 0.0

    @property
    def bound_ms(self) -> float:
        return max(2 * self.before.p99_ms, self.before.p99_ms + LATENCY_FLOOR_MS)

    def problems(self) -> list[str]:
        out = []
        if not self.kept_pct >= KEPT_MIN_PCT:
            out.append(f"{self.stream}: kept {self.kept_pct:.1f} % of its results (< 95 %)")
        if not self.during.p99_ms <= self.bound_ms:
            out.append(f"{self.stream}: p99 {self.during.p99_ms:.0f} ms > {self.bound_ms:.0f} ms")
        return out

    def line(self) -> str:
        b, d = self.before, self.during
        return (f"  {self.stream}: kept {self.kept_pct:.1f} % ({b.rate:.2f} -> {d.rate:.2f}/s, "
                f"{d.results} results), p99 {b.p99_ms:.0f} -> {d.p99_ms:.0f} ms "
                f"(bound {self.bound_ms:.0f}; worst {b.worst_ms:.0f} -> "
                f"{d.worst_ms:.0f})")  # fmt: skip


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


# -- the rig ------------------------------------------------------------------------


@dataclass
class Rig:
    """Workers, an ingest, healthy streams and a subscriber; ``close()`` ends them all."""

    root: Path
    healthy: int = 2
    fps: float = 4.0
    worker_ids: tuple[str, ...] = ("fm-a", "fm-b")
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    workers: dict[str, LocalWorker] = field(default_factory=dict)
    ingest: subprocess.Popen[bytes] | None = None
    api_url: str = ""
    subscriber: Subscriber | None = None
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=10))
    ingest_env: dict[str, str] = field(default_factory=dict)
    """Extra ``FRAMERELAY_*`` settings for the ingest process (the soak's experiments)."""
    _token: str = ""
    quiet_since: float = 0.0
    """``time.time()`` when the last scenario's fault was over and its outcome taken: the
    healthy streams' results since then are a clean baseline for the next one."""

    @property
    def token(self) -> str:
        """An ingest API token with every scope the rig uses."""
        return self._token

    @property
    def healthy_ids(self) -> list[str]:
        return [f"healthy-{i + 1}" for i in range(self.healthy)]

    def start(self) -> Rig:
        self.root.mkdir(parents=True, exist_ok=True)
        self._token = mint(self.secret, SCOPES, "ingest", TOKEN_TTL_S)
        try:
            for wid in self.worker_ids:
                self.start_worker(wid)
            self._start_ingest()
            self.subscriber = Subscriber(
                self.api_url.replace("http://", "ws://") + "/v1/results", self._token
            ).start()
            for sid in self.healthy_ids:
                self.add_stream(healthy_config(sid, self.fps))
            wait_until(self._all_healthy_flow, 60, "first results of every healthy stream")
        except BaseException:
            self.close()
            raise
        return self

    def _all_healthy_flow(self) -> bool:
        assert self.subscriber is not None
        got = {s.stream for s in self.subscriber.snapshot()}
        return all(sid in got for sid in self.healthy_ids)

    def start_worker(self, wid: str, env: dict[str, str] | None = None) -> LocalWorker:
        worker = LocalWorker(
            self.secret, worker_id=wid, args=["--model", str(MODEL), "--threads", "1"],
            env=env, log_path=self.root / f"{wid}.log",
        )  # fmt: skip
        self.workers[wid] = worker.start(timeout_s=120 * TIMEOUT_FACTOR)
        return worker

    def stop_worker(self, wid: str) -> None:
        worker = self.workers.pop(wid)
        self._cont(worker)
        worker.stop()

    def _start_ingest(self) -> None:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("FRAMERELAY_")}
        env.update(FRAMERELAY_TOKEN_SECRETS=self.secret,
                   FRAMERELAY_INGEST_STORE_PATH=str(self.root / "streams.json"),
                   FRAMERELAY_TIMEOUT_FACTOR=str(TIMEOUT_FACTOR))  # fmt: skip
        env.update(self.ingest_env)
        first = self.workers[self.worker_ids[0]]
        with (self.root / "ingest.log").open("wb") as log:
            self.ingest = subprocess.Popen(
                [sys.executable, "-m", "framerelay", "ingest", "--worker-url", first.url,
                 "--worker-id", first.worker_id, "--api-port", str(port)],
                env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.api_url = f"http://127.0.0.1:{port}"
        wait_until(self._ingest_ready, 30, "ingest API")

    def _ingest_ready(self) -> bool:
        assert self.ingest is not None
        if self.ingest.poll() is not None:
            raise RuntimeError(f"ingest exited: {self.log_tail('ingest')}")
        with contextlib.suppress(httpx.TransportError):
            return self.http.get(f"{self.api_url}/readyz").status_code == 200
        return False

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    # -- the ingest API --

    def api(self, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self._token}", **kw.pop("headers", {})}
        return self.http.request(method, f"{self.api_url}{path}", headers=headers, **kw)

    def add_stream(self, config: dict[str, Any]) -> None:
        answer = self.api("POST", "/v1/streams", json=config)
        assert answer.status_code == 201, (answer.status_code, answer.text)

    def place(self, config: dict[str, Any], worker_id: str, url: str | None = None) -> None:
        """A stream on ``worker_id`` (through the orchestrator's routing API)."""
        body = {"worker_id": worker_id, "url": url or self.workers[worker_id].url,
                "stream": config}  # fmt: skip
        answer = self.api("PUT", f"/v1/streams/{config['id']}/worker", json=body)
        assert answer.status_code == 200, (answer.status_code, answer.text)

    def remove_stream(self, stream_id: str) -> None:
        answer = self.api("DELETE", f"/v1/streams/{stream_id}")
        assert answer.status_code in (204, 404), (answer.status_code, answer.text)

    def stream(self, stream_id: str) -> dict[str, Any]:
        answer = self.api("GET", f"/v1/streams/{stream_id}")
        assert answer.status_code == 200, (answer.status_code, answer.text)
        return dict(answer.json())

    def worker_token(self, wid: str) -> str:
        return mint(self.secret, f"worker:{wid}", "worker", TOKEN_TTL_S)

    def worker_http(self, wid: str) -> str:
        return self.workers[wid].url.replace("ws://", "http://").removesuffix("/v1/tunnel")

    # -- processes --

    def pids(self) -> dict[str, int]:
        out = {"ingest": self.ingest.pid} if self.ingest is not None else {}
        for wid, worker in self.workers.items():
            if worker.proc is not None:
                out[wid] = worker.proc.pid
        return out

    def rss(self) -> dict[str, float]:
        return {name: rss_mb(pid) for name, pid in self.pids().items()}

    def alive(self) -> dict[str, bool]:
        procs: dict[str, subprocess.Popen[Any] | None] = {"ingest": self.ingest}
        procs.update((wid, w.proc) for wid, w in self.workers.items())
        return {name: p is not None and p.poll() is None for name, p in procs.items()}

    def freeze(self, wid: str) -> None:
        proc = self.workers[wid].proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGSTOP)

    def thaw(self, wid: str) -> None:
        self._cont(self.workers[wid])

    @staticmethod
    def _cont(worker: LocalWorker) -> None:
        if worker.proc is not None and worker.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        if self.subscriber is not None:
            self.subscriber.stop()
        for worker in self.workers.values():
            self._cont(worker)
        if self.ingest is not None and self.ingest.poll() is None:
            self.ingest.terminate()
            try:
                self.ingest.wait(20)
            except subprocess.TimeoutExpired:
                self.ingest.kill()
                self.ingest.wait(5)
        for wid in list(self.workers):
            self.stop_worker(wid)
        self.http.close()


@contextlib.contextmanager
def running_rig(root: Path, **kw: Any) -> Iterator[Rig]:
    rig = Rig(root, **kw).start()
    try:
        yield rig
    finally:
        rig.close()


# -- one scenario -------------------------------------------------------------------

Scenario = Callable[[Rig], dict[str, Any]]
"""Injects a fault, waits for its outcome, cleans up; returns the bad side's figures."""


def run_scenario(
    rig: Rig,
    name: str,
    scenario: Scenario,
    *,
    setup: Callable[[Rig], None] | None = None,
    baseline_s: float = 5.0,
    min_window_s: float = 7.0,
    rss_settle_s: float = 12.0,
) -> Figures:
    """``setup``, a baseline, the fault, then the windows compared and RSS awaited (see
    :class:`Figures`)."""
    assert rig.subscriber is not None
    if setup is not None:
        setup(rig)
        time.sleep(SETUP_SETTLE_S)
        rig.quiet_since = 0.0  # the setup (a worker restarted) is not a clean baseline
    time.sleep(max(0.0, baseline_s - (time.time() - rig.quiet_since)))
    rss0, t0 = rig.rss(), time.time()
    bad = scenario(rig)
    t1 = max(time.time(), t0 + min_window_s)
    time.sleep(max(0.0, t1 - time.time()) + 1.5)  # the last results in the window arrive
    seen = rig.subscriber.snapshot()
    healthy = [
        HealthyFigures(sid, window(seen, sid, t0 - baseline_s, t0), window(seen, sid, t0, t1))
        for sid in rig.healthy_ids
    ]
    rss1, settle = _settled_rss(rig, rss0, rss_settle_s)
    rig.quiet_since = t1  # the fault was over (and cleaned up) by the end of its window
    return Figures(name, healthy, bad, {k: v for k, v in rss0.items() if k in rss1}, rss1,
                   rig.alive(), t1 - t0, settle)  # fmt: skip


def _settled_rss(
    rig: Rig, before: dict[str, float], timeout_s: float
) -> tuple[dict[str, float], float]:
    """RSS once every process is back within the slack (or after ``timeout_s``)."""
    start = time.monotonic()
    while True:
        now = rig.rss()
        back = all(now[k] <= before[k] + RSS_SLACK_MB for k in now if k in before)
        if back or time.monotonic() - start > timeout_s:
            return now, time.monotonic() - start
        time.sleep(0.5)
