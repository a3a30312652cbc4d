"""Issue 18: regions by latency and SLO-aware placement, piece by piece.

Placement tables on :class:`deploy.placement.Slot` values (pure), the scaler's plan for
streams with a budget, the breach events of :class:`deploy.latency.Latency`, region round
trips from pod records, the tier setting,
and the ingest's ``POST /v1/rtt`` against a real worker process, directly and behind a
delaying TCP proxy (the orchestrator's :class:`deploy.latency.IngestRtt` asking it).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from deploy.latency import IngestRtt, Latency, annotate, region_rtts
from deploy.models import PodRecord, StreamSpec, WorkerState
from deploy.placement import SloBreach, Slot, place
from deploy.providers.base import GpuPrice
from deploy.scaling import plan_workers
from deploy.settings import OrchestratorSettings, TierConfig
from framerelay.auth import KeySet, TokenIssuer
from framerelay.launcher import LocalWorker
from tests.support.delay_proxy import DelayProxy
from tests.support.ingest_api import client, running_ingest

COSTS = {"yolox_nano": 1.0}


def _slot(name: str, rtt: float | None, *, cost: float = 1.0, cap: float = 10.0,
          used: float = 0.0, proc: float = 30.0, region: str | None = None) -> Slot:  # fmt: skip
    slot = Slot(name, "t", False, cap, cost, used)
    slot.region, slot.rtt_ms, slot.region_rtt_ms, slot.processing_ms = region, rtt, rtt, proc
    return slot


def _stream(slo: float | None = None, fps: float = 5.0, sid: str = "cam") -> StreamSpec:
    return StreamSpec(id=sid, url="rtsp://cam/x", fps=fps, latency_slo_ms=slo)


@pytest.mark.parametrize(
    ("case", "slo", "near", "far", "slack", "want", "late"),
    [
        ("SLO fits near only, far cheaper", 100, {}, {"cost": 0.5}, 10, "near", None),
        ("no SLO: nearest region before price", None, {}, {"cost": 0.5}, 10, "near", None),
        ("regions within the slack: price", None, {}, {"cost": 0.5}, 100, "far", None),
        ("near full: far, breach", 100, {"used": 8}, {}, 10, "far", 110.0),
        ("over budget everywhere: fastest", 20, {}, {"cost": 0.5}, 10, "near", 35.0),
        ("nothing measured: as before", 100, {"rtt": None}, {"rtt": None, "cost": 0.5}, 10,
         "far", None),
        ("SLO: unmeasured before over budget", 100, {"rtt": None, "cost": 2}, {}, 10, "near",
         None),
        ("SLO fits both: nearest region", 200, {}, {}, 10, "near", None),
    ],
)  # fmt: skip
def test_placement_by_latency(
    case: str, slo: float | None, near: dict[str, Any], far: dict[str, Any], slack: float,
    want: str, late: float | None,
) -> None:  # fmt: skip
    slots = [_slot("far", **{"rtt": 80.0, **far}), _slot("near", **{"rtt": 5.0, **near})]
    result = place([_stream(slo)], slots, {}, COSTS, region_slack_ms=slack)
    assert result.assign == {"cam": want}, case
    breach = result.breaches.get("cam")
    assert (breach.expected_ms if breach else None) == late, case
    if breach is not None and late is not None:
        assert breach == SloBreach(want, late, float(slo or 0), late - 30.0, 30.0)


def test_a_stream_over_budget_moves_back_once_the_near_region_has_room() -> None:
    stream = _stream(100)
    slots = [_slot("far", 80.0), _slot("near", 5.0)]
    assert place([stream], slots, {"cam": "far"}, COSTS).assign == {"cam": "near"}
    full = [_slot("far", 80.0), _slot("near", 5.0, used=8)]
    assert place([stream], full, {"cam": "far"}, COSTS).assign == {"cam": "far"}


def test_no_churn_between_regions_within_the_slack() -> None:
    slots = [_slot("a", 12.0, region="ra"), _slot("b", 8.0, region="rb")]
    kept = place([_stream()], slots, {"cam": "a"}, COSTS, region_slack_ms=10)
    assert kept.assign == {"cam": "a"}
    moved = place([_stream()], slots, {"cam": "a"}, COSTS, region_slack_ms=2)
    assert moved.assign == {"cam": "b"}


def test_critical_stream_still_never_on_spot_even_when_nearest() -> None:
    spot = _slot("spot", 1.0, cost=0.1)
    spot.no_critical = True
    stream = StreamSpec(id="cam", url="rtsp://cam/x", priority="critical", latency_slo_ms=50)
    result = place([stream], [spot, _slot("od", 80.0)], {}, COSTS)
    assert result.assign == {"cam": "od"} and result.breaches["cam"].worker == "od"


def test_breach_events_once_per_worker_and_met_when_over() -> None:
    latency = Latency()
    late = SloBreach("far", 110.0, 100.0, 80.0, 30.0)
    first = list(latency.report({"cam": late}))
    assert [(k, w, s) for k, w, _, s, _ in first] == [("slo_breach", "far", "cam")]
    assert first[0][4] == late.as_dict()
    assert list(latency.report({"cam": SloBreach("far", 112.0, 100.0, 82.0, 30.0)})) == []
    assert latency.view("cam") == {"worker": "far", "expected_ms": 112.0, "slo_ms": 100.0,
                                   "rtt_ms": 82.0, "processing_ms": 30.0}  # fmt: skip
    over = list(latency.report({}))
    assert [(k, w, s) for k, w, _, s, _ in over] == [("slo_met", "far", "cam")]
    assert latency.view("cam") is None


def _pod(name: str, tier: str, rtt: float | None, proc: float | None = 20.0) -> PodRecord:
    return PodRecord(name=name, tier=tier, slot=0, gen=0, spot=False, ready=True,
                     rtt_ms=rtt, processing_ms=proc)  # fmt: skip


def test_regions_are_the_median_of_their_workers_and_cover_the_unmeasured() -> None:
    settings = OrchestratorSettings(tiers=[
        TierConfig(name="eu", region="eu-central", data_centers=("EU-RO-1", "EU-SE-1")),
        TierConfig(name="eu2", region="eu-central"), TierConfig(name="us"),
    ])  # fmt: skip
    pods = {p.name: p for p in (_pod("e1", "eu", 10.0), _pod("e2", "eu", 30.0),
                                _pod("e3", "eu2", 12.0), _pod("e4", "eu", None, None),
                                _pod("u1", "us", 90.0))}  # fmt: skip
    assert region_rtts(pods.values(), settings) == {"eu-central": 12.0}
    slots = [Slot(n, p.tier, False, 10, 1) for n, p in pods.items()]
    annotate(slots, pods, settings)
    got = {s.name: (s.region, s.rtt_ms, s.region_rtt_ms, s.processing_ms) for s in slots}
    assert got["e1"] == ("eu-central", 10.0, 12.0, 20.0)
    assert got["e4"] == ("eu-central", 12.0, 12.0, 0.0)  # not measured yet: its region's
    assert got["u1"] == (None, 90.0, 90.0, 20.0)  # no region: a region of its own


@pytest.mark.parametrize("region", ["", "eu central", "x" * 65, "eu/1"])
def test_a_bad_region_name_is_refused(region: str) -> None:
    with pytest.raises(ValidationError, match="region"):
        TierConfig(name="eu", region=region)


def test_existing_tier_configs_stay_valid() -> None:
    tier = TierConfig.model_validate(
        {"name": "spot", "interruptible": True, "data_centers": ["EU-RO-1"]}
    )
    assert tier.region is None


@pytest.mark.integration
async def test_ingest_measures_round_trips_on_a_tunnel(
    local_worker: LocalWorker, secret: str, tmp_path: Path
) -> None:
    """``POST /v1/rtt`` straight to a worker and through a proxy adding 2 x 15 ms; the
    orchestrator's client reads it; bad URLs are 422, an unreachable worker a 502."""

    port = int(local_worker.url.rsplit(":", 1)[1].split("/")[0])
    proxy = await DelayProxy(port, 0.015).start()
    out: dict[str, Any] = {}
    async with running_ingest(secret, tmp_path) as ingest, client(ingest) as http:
        auth = ingest.auth("routing:write")
        for label, url in (
            ("direct", local_worker.url),
            ("proxied", f"ws://127.0.0.1:{proxy.port}/v1/tunnel"),
        ):
            body = {"worker_id": "test-worker", "url": url, "pings": 5, "frames": 3}
            out[label] = (await http.post("/v1/rtt", json=body, headers=auth)).json()
        out["refused"] = await _refusals(http, auth)
        rtt = IngestRtt(ingest.base, TokenIssuer(KeySet.from_secrets([secret])), pings=3)
        worker = WorkerState(name="test-worker", ready=True, tunnel_url=local_worker.url)
        latency = Latency(rtt, interval_s=30, wait_s=30)
        await latency.measure([worker], now=100.0)
        await latency.measure([worker], now=110.0)  # not due: not asked again
        out["book"] = (worker.rtt_ms, list(latency.samples["test-worker"]), worker.processing_ms)
        await rtt.aclose()
        out["stuck"] = await _stuck_worker(ingest.base, secret)
    await proxy.aclose()

    direct, proxied = out["direct"], out["proxied"]
    print(f"\nround trip ingest -> worker: direct {direct['rtt_ms']} ms, behind a 2 x 15 ms "
          f"proxy {proxied['rtt_ms']} ms ({proxied['samples_ms']}); probe frames "
          f"{proxied['frame_ms']} ms: processing {proxied['processing_ms']} ms")  # fmt: skip
    assert len(direct["samples_ms"]) == 5 and direct["rtt_ms"] < 25
    assert 30 <= proxied["rtt_ms"] < 80
    for answer in (direct, proxied):
        assert len(answer["frame_ms"]) == 3 and answer["processing_ms"] > 0
        assert min(answer["frame_ms"]) > answer["rtt_ms"]
    assert out["refused"] == [422, 422, 422, 502]
    rtt_ms, samples, processing = out["book"]
    assert len(samples) == 1 and rtt_ms == samples[0] < 25 and processing > 0
    took, stuck_rtt, running = out["stuck"]
    assert took < 1.5 and stuck_rtt is None and running == 1  # the pass went on


async def _refusals(http: httpx.AsyncClient, auth: dict[str, str]) -> list[int]:
    bodies = [
        {"worker_id": "w", "url": "ws://10.9.8.7:8443/v1/tunnel"},  # plain ws:// off this host
        {"worker_id": "w", "url": "ws://127.0.0.1:9/v1/tunnel", "pings": 21},
        {"worker_id": "w", "url": "ws://127.0.0.1:9/v1/tunnel", "frames": 11},
        {"worker_id": "w", "url": "ws://127.0.0.1:9/v1/tunnel"},  # nobody listens
    ]
    return [(await http.post("/v1/rtt", json=b, headers=auth)).status_code for b in bodies]


def _plan(slo: float | None, expected: dict[str, float] | None) -> dict[str, int]:
    """Pods per tier for one 5 fps stream: "far" has a warm pod with room and is cheaper,
    "near" has none (up to 2)."""
    settings = OrchestratorSettings(tiers=[
        TierConfig(name="near", gpu_types=("A",), max_workers=2, region="near-1"),
        TierConfig(name="far", gpu_types=("B",), max_workers=2, region="far-1"),
    ])  # fmt: skip
    prices = {"A": GpuPrice("A", 2.0, 2.0, 1.0, 1.0), "B": GpuPrice("B", 1.0, 1.0, 0.5, 0.5)}
    capacity, warm = {"near": 10.0, "far": 10.0}, {"near": 0, "far": 1}
    streams = [_stream(slo)]
    return plan_workers(settings, streams, capacity, prices, warm, expected=expected)


@pytest.mark.parametrize(
    ("case", "slo", "expected", "want"),
    [
        ("budget missed on far: a near pod", 100, {"near": 40.0, "far": 120.0}, {"near": 1}),
        ("near not measured yet: tried", 100, {"far": 120.0}, {"near": 1}),
        ("budget met on far: price", 150, {"near": 40.0, "far": 120.0}, {"near": 0}),
        ("missed everywhere: price", 30, {"near": 40.0, "far": 120.0}, {"near": 0}),
        ("no budget: price", None, {"near": 40.0, "far": 120.0}, {"near": 0}),
        ("nothing measured: as before", 100, None, {"near": 0}),
    ],
)
def test_scaler_opens_a_pod_where_the_budget_holds(
    case: str, slo: float | None, expected: dict[str, float] | None, want: dict[str, int]
) -> None:
    assert _plan(slo, expected) == {"far": 1, **want}, case


def test_tier_latency_is_remembered_while_the_tier_has_no_worker() -> None:
    latency = Latency()
    pods = [_pod("n1", "near", 10.0, 30.0), _pod("n2", "near", 20.0, 30.0),
            _pod("f1", "far", 80.0, 30.0)]  # fmt: skip
    assert latency.tier_expected(pods) == {"near": 45.0, "far": 110.0}
    assert latency.tier_expected(pods[2:]) == {"near": 45.0, "far": 110.0}


async def _hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A worker that accepts and never answers, for 1.5 s."""
    await asyncio.sleep(1.5)
    writer.close()


async def _stuck_worker(ingest: str, secret: str) -> tuple[float, float | None, int]:
    """(seconds one pass took, the worker's rtt_ms after it, measurements still running)
    for a worker that does not answer, with a pass that waits 0.3 s."""
    hole = await asyncio.start_server(_hold, "127.0.0.1", 0)
    port = hole.sockets[0].getsockname()[1]
    latency = Latency(IngestRtt(ingest, TokenIssuer(KeySet.from_secrets([secret]))), wait_s=0.3)
    stuck = WorkerState(name="stuck", ready=True, tunnel_url=f"ws://127.0.0.1:{port}/v1/tunnel")
    t0 = time.monotonic()
    await latency.measure([stuck], now=0.0)
    took, running = time.monotonic() - t0, len(latency._running)
    await latency.aclose()
    hole.close()
    await hole.wait_closed()
    return took, stuck.rtt_ms, running
