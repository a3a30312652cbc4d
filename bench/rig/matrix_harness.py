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

import contextlib
import math
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.rig.common import CLIP, MODEL, ROOT, TIMEOUT_FACTOR, free_port, mint
from bench.rig.matrix_results import (
    KEPT_MIN_PCT,
    RSS_SLACK_MB,
    Figures,
    HealthyFigures,
    Subscriber,
    wait_until,
    window,
)
from framerelay.launcher import LocalWorker

SCOPES = ("streams:read", "streams:write", "routing:write", "results:*", "metrics:read")
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
    """``time.time()`` when the last scenario's fault was over and its outcome taken (or the
    rig's healthy streams first answered): the healthy streams' results since then are a
    clean baseline for the next one."""

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
        self.quiet_since = time.time()  # the first scenario's baseline: after the start-up
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
        # the scenarios add the sample clip and damaged copies under the rig's folder
        roots = (ROOT / "samples", self.root, Path(tempfile.gettempdir()))
        env["FRAMERELAY_INGEST_FILE_ROOTS"] = os.pathsep.join(str(r) for r in roots)
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
    latency_factor: float | None = 2.0,
    kept_min_pct: float = KEPT_MIN_PCT,
) -> Figures:
    """``setup``, a baseline, the fault, then the windows compared and RSS awaited (see
    :class:`Figures`; ``latency_factor`` and ``kept_min_pct``: :class:`HealthyFigures`)."""
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
        HealthyFigures(sid, before, window(seen, sid, t0, t1), latency_factor, kept_min_pct)
        for sid in rig.healthy_ids
        for before in [window(seen, sid, t0 - baseline_s, t0)]
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
