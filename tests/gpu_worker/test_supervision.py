"""Issue 11: the worker's inference loop is supervised.

A detector that raises fails its batch only, a tracker that raises fails its
frame only (and resets that stream's tracker), a FRAME with NaN/Infinity in
its header is answered for that frame alone; the loop carries on and the
other streams keep their results. A batch running past ``inference_stall_s``
or a loop that ended turns ``/readyz`` 503 with the reason, sets the metrics,
closes every tunnel with 1011 and refuses new ones, until inference moves.
Real worker (in-process, real socket), real ONNX model on CPU.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from framerelay.detections import Detections
from framerelay.errors import ConfigError
from gpu_worker.batcher import ErrorLog
from gpu_worker.budgets import ErrorBudget
from gpu_worker.detectors import Detector, ModelInput
from gpu_worker.faults import FaultInjector, InjectedFault
from gpu_worker.server import Worker
from gpu_worker.settings import WorkerSettings
from gpu_worker.watchdog import Heartbeat, Watchdog
from tests.conftest import TIMEOUT_FACTOR
from tests.gpu_worker.tunnel_rig import (
    BLACK_JPEG,
    JPEG,
    Tunnel,
    frame,
    http_get,
    metric,
    open_tunnel,
    raw_frame,
    settle,
)
from tests.support.waiting import wait_until_async
from tests.support.worker_harness import running_worker, token

HOOKS: dict[str, Any] = {"test_hooks": True}
T = TIMEOUT_FACTOR


def _base(url: str) -> str:
    return url.replace("ws://", "http://").removesuffix("/v1/tunnel")


async def _streams(tunnel: Tunnel, *ids: str) -> None:
    for sid in ids:
        await tunnel.open_stream(sid)


async def _one_each(tunnel: Tunnel, ids: Sequence[str], seq: int) -> None:
    """One frame on each stream, then wait for every answer."""
    for sid in ids:
        await tunnel.send_frame(frame(sid, seq))
    await settle(tunnel, list(ids), 20 * T)


# -- unit: the watchdog, the error log, the budget, the faults ----------------------


def test_watchdog_reports_a_stall_once_and_the_recovery() -> None:
    now = [100.0]
    events: list[str] = []
    beat = Heartbeat()
    dog = Watchdog(beat, 2.0, on_stall=events.append, on_recover=lambda: events.append("ok"),
                   clock=lambda: now[0])  # fmt: skip
    assert dog.check() is None and dog.interval_s == 0.5
    beat.started(100.0)
    now[0] = 101.9
    assert dog.check() is None
    now[0] = 102.5
    assert dog.check() == "inference stalled: a batch has run for 2.5 s (limit 2 s)"
    now[0] = 103.0
    assert dog.check() is not None  # still stalled: no second callback
    beat.finished(103.1)
    assert dog.check() is None
    assert events == ["inference stalled: a batch has run for 2.5 s (limit 2 s)", "ok"]
    assert beat.batches == 1 and beat.busy_for(200.0) == 0.0


async def test_watchdog_sees_a_loop_that_ended() -> None:
    task: asyncio.Task[None] = asyncio.create_task(asyncio.sleep(0))
    dog = Watchdog(Heartbeat(), 10.0, on_stall=lambda r: None, on_recover=lambda: None)
    dog.watch(task)
    assert dog.check() is None
    await task
    ended = dog.check()
    assert ended == "inference loop ended"


def test_error_log_logs_each_distinct_error_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    errors = ErrorLog(repeat_s=60)
    with caplog.at_level(logging.ERROR, "gpu_worker.batcher"):
        logged = [errors.report("inference failed", RuntimeError("boom"), now=t) for t in range(5)]
        logged.append(errors.report("inference failed", RuntimeError("other"), now=5))
        logged.append(errors.report("inference failed", RuntimeError("boom"), now=61))
    assert logged == [True, False, False, False, False, True, True]
    assert "(4 more like it since)" in caplog.records[-1].getMessage()


def test_error_budget_allows_the_limit_per_second() -> None:
    budget = ErrorBudget(3)
    assert [budget.spend(10.0 + i * 0.1) for i in range(5)] == [True, True, True, False, False]
    assert budget.spend(11.05)  # a new window
    assert all(ErrorBudget(0).spend(1.0) for _ in range(100))  # 0: no limit


@pytest.mark.parametrize(
    "spec", ["hang_inference_after", "raise_inference_after:x", "raise_track_after:-1",
             "explode:3", "raise_track_after:²", "hang_inference_after:1234567890"],
)  # fmt: skip
def test_unknown_faults_are_refused(spec: str) -> None:
    with pytest.raises(ConfigError, match="not a known fault"):
        FaultInjector(spec)
    with pytest.raises(ConfigError, match="not a known fault"):
        WorkerSettings(test_hooks=True, test_fault=spec)


def test_raise_faults_count_then_raise() -> None:
    faults = FaultInjector("raise_track_after:2")
    faults.before_infer()  # another fault's hook: no-op
    faults.before_track()
    faults.before_track()
    with pytest.raises(InjectedFault):
        faults.before_track()
    infer = FaultInjector("raise_inference_after:0")
    with pytest.raises(InjectedFault):
        infer.before_infer()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "1e9"])
def test_inference_stall_must_be_finite_and_positive(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FRAMERELAY_WORKER_INFERENCE_STALL_S", value)
    with pytest.raises(ValueError, match="inference_stall_s"):
        WorkerSettings()


@pytest.mark.parametrize(
    "name", ["TOKEN_LEEWAY_S", "AUTH_WINDOW_S", "BATCH_WAIT_MS", "RESULT_MIN_CONFIDENCE",
             "SNAPSHOT_INTERVAL_S", "SHUTDOWN_TIMEOUT_S", "INFERENCE_STALL_S"],
)  # fmt: skip
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400"])
def test_every_float_setting_must_be_finite(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(f"FRAMERELAY_WORKER_{name}", value)
    with pytest.raises(ValueError, match=name.lower()):
        WorkerSettings()


# -- the real worker --------------------------------------------------------------


async def test_nan_and_infinite_headers_fail_only_their_frame(secret: str) -> None:
    """The issue's regression: NaN/+Inf captured_at with a new epoch stopped the loop."""
    async with running_worker(secret) as (_, url), open_tunnel(url, token(secret)) as tun:
        await _streams(tun, "good", "bad")
        await _one_each(tun, ["good", "bad"], 0)
        sent = {
            1: {"captured_at": "NaN", "epoch": "1"},
            2: {"captured_at": "Infinity", "epoch": "2"},
            3: {"captured_at": "-Infinity", "epoch": "3"},
            4: {"captured_at": "1e400", "epoch": "4"},
            5: {"captured_at": "1e12", "epoch": "5"},
            6: {"scale": "NaN"},
            7: {"scale": "Infinity"},
            8: {"pts": "1e400"},
        }
        for seq, fields in sent.items():
            await tun.send_raw("bad", seq, raw_frame("bad", seq, **fields))
            await tun.send_frame(frame("good", seq))
            await settle(tun, ["good", "bad"], 20 * T)
        await tun.send_frame(frame("bad", 9, epoch=6))  # the session is intact
        await settle(tun, ["bad"], 20 * T)
        ready = await http_get(f"{_base(url)}/readyz")
        out: dict[str, Any] = {"ready": ready.status_code, "bad": sent}
    good, bad = tun.streams["good"], tun.streams["bad"]
    assert [r.seq for r in good.results] == list(range(9))
    assert [(e.code, e.seq) for e in bad.errors] == [("bad_frame", s) for s in out["bad"]]
    assert "finite" in bad.errors[0].message or "captured_at" in bad.errors[0].message
    assert [r.seq for r in bad.results] == [0, 9]
    assert tun.close_code is None and out["ready"] == 200
    print(f"\n{len(bad.errors)} bad headers answered bad_frame; good stream: 9/9 results")


async def test_inference_errors_fail_their_batch_and_the_loop_goes_on(
    secret: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, "gpu_worker.batcher"):
        fault = {**HOOKS, "test_fault": "raise_inference_after:4"}
        async with (
            running_worker(secret, **fault) as (_, url),
            open_tunnel(url, token(secret)) as tun,
        ):
            await _streams(tun, "a", "b")
            for seq in range(5):
                await _one_each(tun, ["a", "b"], seq)
            base = _base(url)
            out: dict[str, Any] = {
                "ready": (await http_get(f"{base}/readyz")).status_code,
                "metrics": (await http_get(f"{base}/metrics")).text,
            }
    for sid in ("a", "b"):
        stream = tun.streams[sid]
        assert len(stream.results) + len(stream.errors) == 5  # every frame answered
        assert {e.code for e in stream.errors} == {"inference_error"}
        assert all(e.seq is not None and "InjectedFault" in e.message for e in stream.errors)
    assert sum(len(tun.streams[s].results) for s in "ab") == 4
    text = out["metrics"]
    assert metric(text, 'framerelay_worker_batch_errors_total{stage="infer"}') == 6
    assert metric(text, 'framerelay_worker_frames_total{outcome="inference_error"}') == 6
    assert metric(text, "framerelay_worker_ready") == 1
    assert metric(text, "framerelay_worker_inference_stalled") == 0
    assert out["ready"] == 200 and tun.close_code is None
    logged = [r for r in caplog.records if "inference failed" in r.getMessage()]
    assert len(logged) == 1  # the same error, logged once
    print(f"\n4 results, then 6 frames answered inference_error; {len(logged)} log line")


class _PoisonDetector:
    """The real detector, raising whenever a batch holds a black image."""

    def __init__(self, real: Detector) -> None:
        self.real = real
        self.input_size, self.class_names = real.input_size, real.class_names
        self.providers = real.providers
        self.sizes: list[int] = []

    def infer(self, batch: Sequence[ModelInput]) -> list[Detections]:
        self.sizes.append(len(batch))
        if any(int(m.image[8, 8].max()) < 20 for m in batch):
            raise RuntimeError("poisoned image")
        return self.real.infer(batch)


async def test_one_poisoned_frame_fails_alone_in_a_shared_batch(secret: str) -> None:
    opts: dict[str, Any] = {"max_batch": 4, "batch_wait_ms": 50}
    async with running_worker(secret, **opts) as (worker, url):
        poison = _PoisonDetector(worker.detector)
        worker.batcher.detector = poison
        async with open_tunnel(url, token(secret)) as tun:
            await _streams(tun, "a", "b", "c")
            for seq in range(3):
                await tun.send_frame(frame("a", seq))
                await tun.send_frame(frame("b", seq), BLACK_JPEG if seq == 1 else JPEG)
                await tun.send_frame(frame("c", seq))
                await settle(tun, ["a", "b", "c"], 20 * T)
    sizes = poison.sizes
    assert max(sizes) > 1  # frames of several streams did share a batch
    assert [(e.code, e.seq) for e in tun.streams["b"].errors] == [("inference_error", 1)]
    assert [r.seq for r in tun.streams["b"].results] == [0, 2]
    for sid in ("a", "c"):
        assert [r.seq for r in tun.streams[sid].results] == [0, 1, 2]
    print(f"\nbatch sizes {sizes}: only the poisoned frame failed")


class _FlakyTracker:
    """Wraps a stream's real tracker: its second update raises."""

    def __init__(self, real: Any) -> None:
        self.real, self.name = real, real.name
        self.updates = self.resets = 0

    def update(self, detections: Detections, t: float) -> Detections:
        self.updates += 1
        if self.updates == 2:
            raise ValueError("tracker broke")
        result: Detections = self.real.update(detections, t)
        return result

    def reset(self) -> None:
        self.resets += 1
        self.real.reset()

    def snapshot(self) -> bytes:
        data: bytes = self.real.snapshot()
        return data


async def test_a_tracker_error_fails_its_frame_and_resets_its_stream(secret: str) -> None:
    async with running_worker(secret) as (worker, url), open_tunnel(url, token(secret)) as tun:
        await _streams(tun, "good", "flaky")
        await wait_until_async(lambda: bool(worker.connections), 5, "a connection")
        conn = next(iter(worker.connections))
        await wait_until_async(lambda: "flaky" in conn.sessions, 5, "the flaky session")
        flaky = _FlakyTracker(conn.sessions["flaky"].tracker)
        conn.sessions["flaky"].tracker = flaky
        for seq in range(4):
            await _one_each(tun, ["good", "flaky"], seq)
    assert [(e.code, e.seq) for e in tun.streams["flaky"].errors] == [("track_error", 1)]
    assert "tracker reset" in tun.streams["flaky"].errors[0].message
    assert [r.seq for r in tun.streams["flaky"].results] == [0, 2, 3]
    assert [r.seq for r in tun.streams["good"].results] == [0, 1, 2, 3]
    assert flaky.resets == 1


async def test_raise_track_after_fails_frames_and_keeps_serving(secret: str) -> None:
    fault = {**HOOKS, "test_fault": "raise_track_after:3"}
    async with (
        running_worker(secret, **fault) as (_, url),
        open_tunnel(url, token(secret)) as tun,
    ):
        await _streams(tun, "a", "b")
        for seq in range(4):
            await _one_each(tun, ["a", "b"], seq)
        ready = (await http_get(f"{_base(url)}/readyz")).status_code
        text = (await http_get(f"{_base(url)}/metrics")).text
    results = sum(len(tun.streams[s].results) for s in "ab")
    errors = [e for s in "ab" for e in tun.streams[s].errors]
    assert results == 3 and len(errors) == 5 and {e.code for e in errors} == {"track_error"}
    assert ready == 200 and tun.close_code is None
    assert metric(text, 'framerelay_worker_batch_errors_total{stage="track"}') == 5


async def _poll_ready(base: str, want: int, timeout_s: float) -> tuple[float, str]:
    """Seconds until /readyz answers ``want``, and its body."""
    t0 = time.monotonic()
    while True:
        resp = await http_get(f"{base}/readyz")
        if resp.status_code == want:
            return time.monotonic() - t0, resp.text
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"/readyz still {resp.status_code} ({resp.text!r})")
        await asyncio.sleep(0.05)


async def _tunnel_status(url: str, tok: str) -> int:
    try:
        async with connect(url, additional_headers={"Authorization": f"Bearer {tok}"},
                           compression=None, proxy=None):  # fmt: skip
            return 101
    except InvalidStatus as exc:
        return exc.response.status_code


async def _hang_scenario(worker: Worker, url: str, tok: str) -> dict[str, Any]:
    base, out = _base(url), dict[str, Any]()
    async with open_tunnel(url, tok) as tun:
        await _streams(tun, "cam")
        for seq in range(2):
            await _one_each(tun, ["cam"], seq)
        await tun.send_frame(frame("cam", 2))  # this batch hangs
        t0 = time.monotonic()
        out["unready_s"], out["readyz"] = await _poll_ready(base, 503, 5 * T)
        out["unready_s"] = time.monotonic() - t0
        await asyncio.wait_for(tun.closed.wait(), 5 * T)
        out["close"] = (tun.close_code, tun.close_reason)
    out["stalled_metrics"] = (await http_get(f"{base}/metrics")).text
    out["new_tunnel"] = await _tunnel_status(url, tok)
    worker.batcher.faults.release()  # the stalled batch finishes after all
    out["recover_s"], _ = await _poll_ready(base, 200, 5 * T)
    out["recovered_metrics"] = (await http_get(f"{base}/metrics")).text
    async with open_tunnel(url, tok) as tun:
        await _streams(tun, "cam")
        await _one_each(tun, ["cam"], 0)
        out["after"] = len(tun.streams["cam"].results)
    return out


async def test_a_stalled_batch_turns_the_worker_unready_and_closes_its_tunnels(secret: str) -> None:
    fault = {**HOOKS, "test_fault": "hang_inference_after:2", "inference_stall_s": 1.0}
    async with running_worker(secret, **fault) as (worker, url):
        out = await _hang_scenario(worker, url, token(secret))
    print(f"\nstall 1 s: /readyz 503 after {out['unready_s']:.2f} s ({out['readyz'].strip()!r}); "
          f"tunnel closed {out['close']}; new tunnel {out['new_tunnel']}; "
          f"ready again {out['recover_s']:.2f} s after the batch finished")  # fmt: skip
    assert out["unready_s"] <= 1.0 + 1.0 * T
    assert out["readyz"].startswith("inference stalled: a batch has run for")
    code, reason = out["close"]
    assert code == 1011 and reason.startswith("inference stalled for ")
    assert out["new_tunnel"] == 503
    stalled = out["stalled_metrics"]
    assert metric(stalled, "framerelay_worker_ready") == 0
    assert metric(stalled, "framerelay_worker_inference_stalled") == 1
    assert metric(stalled, "framerelay_worker_inference_busy_seconds") >= 1.0
    assert metric(stalled, 'framerelay_worker_tunnels_closed_total{reason="stalled"}') == 1
    assert out["recover_s"] <= 1.0 * T
    assert metric(out["recovered_metrics"], "framerelay_worker_ready") == 1
    assert metric(out["recovered_metrics"], "framerelay_worker_inference_stalled") == 0
    assert out["after"] == 1


async def test_a_loop_that_ended_is_noticed(secret: str) -> None:
    async with running_worker(secret) as (worker, url), open_tunnel(url, token(secret)) as tun:
        await _streams(tun, "cam")
        await _one_each(tun, ["cam"], 0)
        assert worker._batch_task is not None
        worker._batch_task.cancel()
        waited, body = await _poll_ready(_base(url), 503, 3 * T)
        await asyncio.wait_for(tun.closed.wait(), 3 * T)
        close = (tun.close_code, tun.close_reason)
    assert waited <= 1.0 * T
    assert body.strip() == "inference loop ended: cancelled"
    assert close == (1011, "inference loop ended: cancelled")
