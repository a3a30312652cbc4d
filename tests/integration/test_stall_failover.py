"""Acceptance (issue 11): a worker frozen by SIGSTOP for 10 s is noticed.

(a) With a second worker in the pool, the frozen worker's streams move there
within 5 s (track ids continue) and results resume; the orchestrator can
place them again afterwards. (b) With one worker, its streams show STALLED
within 3 s and return to RUNNING with results after SIGCONT by themselves.
Real worker processes, the real ingest service and API; each test prints
its timings.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from framerelay.results import ResultRecord
from ingest.settings import StreamConfig
from tests.conftest import CLIP, TIMEOUT_FACTOR
from tests.support.failover import ingest, metric, signal_worker, workers
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.integration
FREEZE_S = 10.0


def _cam(sid: str) -> dict[str, Any]:
    return {"id": sid, "url": str(CLIP), "fps": 5, "realtime": True, "loop": True}


def _of(got: list[tuple[float, ResultRecord]], sid: str, worker: str | None = None) -> list[float]:
    return [t for t, r in got if r.stream_id == sid and worker in (None, r.worker_id)]


def _gap(times: list[float], start: float) -> float:
    """Longest wait between results (or from ``start``) after ``start``."""
    later = [start, *(t for t in times if t > start)]
    return max((b - a for a, b in itertools.pairwise(later)), default=float("inf"))


async def test_a_frozen_pool_worker_fails_over_to_the_other(secret: str, tmp_path: Path) -> None:
    placed = {"a1": "gpu-a", "a2": "gpu-a", "b1": "gpu-b"}

    with workers(secret, "gpu-a", "gpu-b") as procs:
        async with ingest(secret, tmp_path) as (service, http, got):

            async def put(sid: str, worker: str) -> bool:
                body = {"worker_id": worker, "url": procs[worker].url, "stream": _cam(sid)}
                r = await http.put(f"/v1/streams/{sid}/worker", json=body)
                assert r.status_code == 200, r.text
                return bool(r.json()["changed"])

            for sid, worker in placed.items():
                assert await put(sid, worker)
            await wait_until_async(
                lambda: all(len(_of(got, s)) >= 5 for s in placed), 60, "results"
            )
            before = {s: _ids(got, s, n=None) for s in ("a1", "a2")}
            t0 = time.monotonic()
            signal_worker(procs["gpu-a"], signal.SIGSTOP)
            try:
                routing: dict[str, str] = {}

                async def moved() -> bool:
                    routing.update((await http.get("/v1/routing")).json())
                    return routing == {s: "gpu-b" for s in placed}

                await wait_until_async(moved, 10, "the streams moved to B")
                t_moved = time.monotonic()
                await wait_until_async(
                    lambda: all(_of(got, s, "gpu-b") for s in ("a1", "a2")),
                    10,
                    "results on B",
                    every_s=0.02,
                )
                t_res = time.monotonic()
                workers_view = (await http.get("/v1/workers")).json()
                failovers = metric(service, "framerelay_ingest_failovers_total")
                stalled_a = metric(service, "framerelay_ingest_tunnel_stalls_total", worker="gpu-a")
                streams_view = (await http.get("/v1/streams")).json()
                await asyncio.sleep(max(0.0, t0 + FREEZE_S - time.monotonic()))
            finally:
                signal_worker(procs["gpu-a"], signal.SIGCONT)
            gaps = {s: _gap(_of(got, s), t0) for s in placed}
            after = {s: _ids([(t, r) for t, r in got if r.worker_id == "gpu-b"], s, first=True)
                     for s in ("a1", "a2")}  # fmt: skip
            assert not await put("a1", "gpu-b")  # the orchestrator repeats itself: no change
            assert await put("a1", "gpu-a")  # and places it back once A answers again
            n = len(_of(got, "a1", "gpu-a"))
            await wait_until_async(
                lambda: len(_of(got, "a1", "gpu-a")) >= n + 5, 30, "a1 back on A"
            )
            routing = (await http.get("/v1/routing")).json()
            out: dict[str, Any] = {
                "move_s": t_moved - t0, "results_s": t_res - t0, "gaps": gaps,
                "failovers": (service.registry.failovers, failovers, stalled_a),
                "workers": workers_view,
                "streams": streams_view, "before": before, "after": after, "routing": routing,
            }  # fmt: skip

    longest = ", ".join(f"{s} {g:.2f} s" for s, g in out["gaps"].items())
    print(
        f"\nSIGSTOP gpu-a: its streams on gpu-b after {out['move_s']:.2f} s, results from "
        f"gpu-b after {out['results_s']:.2f} s; longest result gap: {longest}"
    )
    assert out["move_s"] <= 5.0 * TIMEOUT_FACTOR
    assert out["results_s"] <= 5.0 * TIMEOUT_FACTOR
    assert out["failovers"] == (2, 2.0, None)  # gpu-a's tunnel closed once emptied
    assert out["gaps"]["b1"] < 2.0 * TIMEOUT_FACTOR  # the healthy worker's stream went on
    assert {w["name"]: w["state"] for w in out["workers"]} == {"default": "IDLE", "gpu-b": "UP"}
    assert {s["id"]: s["state"] for s in out["streams"]} == dict.fromkeys(placed, "RUNNING")
    for sid in ("a1", "a2"):  # the session resumed on gpu-b (its snapshot): a track kept its
        before, after = out["before"][sid], out["after"][sid]  # id or got a new one, never
        assert after and all(i in before or i > max(before) for i in after), (before, after)
    assert out["routing"] == {"a1": "gpu-a", "a2": "gpu-b", "b1": "gpu-b"}


async def test_a_frozen_lone_worker_stalls_its_streams_which_recover(
    secret: str, tmp_path: Path
) -> None:
    sids = ("cam-1", "cam-2")

    with workers(secret, "solo") as procs:
        worker = procs["solo"]
        streams = [StreamConfig(**_cam(s)) for s in sids]
        async with ingest(secret, tmp_path, worker_url=worker.url, streams=streams) as (
            service, http, got,
        ):  # fmt: skip
            await wait_until_async(lambda: all(len(_of(got, s)) >= 5 for s in sids), 60, "results")
            t0, wall0 = time.monotonic(), time.time()
            signal_worker(worker, signal.SIGSTOP)
            try:

                async def stalled() -> bool:
                    states = {s["id"]: s["state"] for s in (await http.get("/v1/streams")).json()}
                    return set(states.values()) == {"STALLED"}

                await wait_until_async(stalled, 6, "the stall seen")
                seen = time.monotonic()
                tunnel = (await http.get("/v1/workers")).json()[0]
                gauge = metric(service, "framerelay_ingest_tunnel_state",
                               worker="default", state="STALLED")  # fmt: skip
                stalled_at = [_stalled_at(service.streams[s].history) - wall0 for s in sids]
                await asyncio.sleep(max(0.0, t0 + FREEZE_S - time.monotonic()))
            finally:
                signal_worker(worker, signal.SIGCONT)
            t1 = time.monotonic()
            n = {s: len(_of(got, s)) for s in sids}

            async def recovered() -> bool:
                states = {s["id"]: s["state"] for s in (await http.get("/v1/streams")).json()}
                fresh = all(len(_of(got, s)) > n[s] for s in sids)
                return fresh and set(states.values()) == {"RUNNING"}

            await wait_until_async(recovered, 20, "A recovered")
            back = time.monotonic()
            out: dict[str, Any] = {
                "seen_s": seen - t0, "stalled_s": stalled_at, "back_s": back - t1,
                "tunnel": tunnel, "gauge": gauge, "stalls": service.client.health.stalls,
                "connects": service.client.connects,
            }  # fmt: skip

    print(
        f"\nSIGSTOP the only worker: streams STALLED after "
        f"{', '.join(f'{t:.2f}' for t in out['stalled_s'])} s (API saw it after "
        f"{out['seen_s']:.2f} s); RUNNING with results {out['back_s']:.2f} s after SIGCONT; "
        f"tunnel reconnected {out['connects'] - 1} time(s)"
    )
    assert max(out["stalled_s"]) <= 3.0 + 0.25 * TIMEOUT_FACTOR
    assert out["tunnel"]["name"] == "default" and out["tunnel"]["state"] == "STALLED"
    assert "not answering" in out["tunnel"]["stall_reason"]
    assert out["stalls"] >= 1 and out["gauge"] == 1.0
    assert out["back_s"] <= 10.0 * TIMEOUT_FACTOR


def _ids(
    got: list[tuple[float, ResultRecord]], sid: str, *, first: bool = False, n: int | None = 10
) -> set[int]:
    """Track ids in the last (or ``first``) ``n`` results of ``sid`` (None: all)."""
    recs = [r for _, r in got if r.stream_id == sid]
    if n is not None:
        recs = recs[:n] if first else recs[-n:]
    return {d.tracker_id for r in recs for d in r.detections if d.tracker_id > 0}


def _stalled_at(history: Any) -> float:
    return float(next(h["at"] for h in reversed(history) if h["state"] == "STALLED"))
