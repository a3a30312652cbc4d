"""GET /v1/events and GET /v1/history of a real orchestrator API: the real fleet logic
against the RunPod API v2 contract server and a real Redis, with a fake clock. Two
community-cloud pods are lost (one vanishes with its host, RunPod puts the other in
ERROR) and a pod fails its health checks: each event appears with its reason, the
streams' re-homing too; fleet:read only; bad ``since`` values are a 422, never a
traceback."""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any

import httpx
import pytest

from bench.rig.runpod_v2_contract import ContractServer
from deploy.api import create_app
from deploy.clock import FakeClock
from deploy.health import Probe, StatusProber
from tests.support.auth import mint
from tests.support.contract_fleet import (
    TICK_S,
    WARM_TIERS,
    community_pods,
    fleet_on_contract,
    passes,
    stream_spec,
)
from tests.support.orchestrator import serving_here

pytestmark = pytest.mark.integration
SICK = "heartbeat failed: connection refused"


class SickProber(StatusProber):
    """The provider's status, except for the pods named in ``sick``: their heartbeat fails."""

    def __init__(self) -> None:
        super().__init__(20)
        self.sick: set[str] = set()

    async def probe(
        self, name: str, tunnel_url: str, http_url: str, *, canary: bool,
        tls_name: str | None = None,
    ) -> Probe:  # fmt: skip
        if name in self.sick:
            return Probe(alive=False, error=SICK)
        return await super().probe(name, tunnel_url, http_url, canary=canary)


def kinds(body: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in body["events"] if e["kind"] == kind]


async def test_preempted_and_replaced_pods_show_in_events_with_their_reasons() -> None:
    clock = FakeClock(dt.datetime(2026, 3, 2, 12, tzinfo=dt.UTC))
    state = ContractServer("rpa_" + secrets.token_hex(12), clock=clock.now)
    async with fleet_on_contract(state, clock, WARM_TIERS) as orch:
        prober = SickProber()
        orch.fleet.prober = prober
        for i in range(9):  # 9 x 5 fps, 3 per worker: the warm on-demand one, 2 community
            await orch.store.put_stream(stream_spec(f"std-{i}"))
        await passes(orch, clock, 5)
        assert len(community_pods(state)) == 2 and not orch.fleet.unplaced
        started = clock.now() - TICK_S / 2  # events of the next pass are after it
        vanish, error = community_pods(state)
        state.vanish(vanish)  # its host is lost
        state.fail_pod(error, "the GPU fell off the bus")
        await passes(orch, clock, 6)
        sick = next(p.name for p in (await orch.store.pods()).values() if p.tier == "ondemand")
        prober.sick.add(sick)
        await passes(orch, clock, 6)

        async with (
            serving_here(create_app(orch)) as url,
            httpx.AsyncClient(base_url=url) as http,
        ):
            read = {"Authorization": f"Bearer {mint(orch.keys, ['fleet:read'], 'orchestrator')}"}
            all_events = (await http.get("/v1/events", headers=read)).json()
            body = (await http.get("/v1/events", params={"since": started}, headers=read)).json()
            history = (await http.get("/v1/history", headers=read)).json()
    assert all_events["kept"] == 500 and len(all_events["events"]) > len(body["events"])
    assert all(e["t"] > started for e in body["events"])
    seqs = [e["seq"] for e in all_events["events"]]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    vanished, failed = kinds(body, "vanished"), kinds(body, "failed")
    assert [e["reason"] for e in vanished] == [f"pod {vanish} gone from the provider"]
    assert [e["reason"] for e in failed] == [
        "RunPod says ERROR (its container cannot recover) for NVIDIA RTX A4000 in EU-RO-1/COMMUNITY"
    ]
    assert all(e["tier"] == "community" and e["pod"] for e in vanished + failed)
    lost = {e["pod"] for e in vanished + failed}
    rehomed = [e for e in kinds(body, "moved") if e["old"] in lost]
    assert len(rehomed) == 6, rehomed  # each stream of the two lost community workers
    assert all(e["stream"] and "is lost or not ready" in e["reason"] for e in rehomed)
    unhealthy = kinds(body, "unhealthy")
    assert [e["pod"] for e in unhealthy] == [sick] and unhealthy[0]["reason"] == SICK
    replaced = kinds(body, "replaced")
    assert [(e["pod"], e["reason"]) for e in replaced] == [(sick, SICK)]
    assert any(e["reason"] == SICK for e in kinds(body, "terminated_unhealthy"))
    assert kinds(all_events, "created") and all(
        e["reason"].startswith("tier ") for e in kinds(all_events, "created")
    )
    assert history["points"] == 360 and len(history["timestamps"]) == 4  # 17 passes of 2 s
    assert set(history["pods"]) == {"ondemand", "community"}
    assert max(history["pods"]["community"]) == 2 and history["streams_placed"][-1] == 9
    last = history["usd_per_hour"][-1]
    assert last > 0 and history["usd_per_stream_hour"][-1] == pytest.approx(last / 9, 1e-3)


@pytest.mark.parametrize(
    ("scopes", "query", "status", "says"),
    [
        (None, "", 401, "Authorization"),
        (("fleet:write", "metrics:read"), "", 403, "fleet:read"),
        (("fleet:read",), "?since=NaN", 422, "finite"),
        (("fleet:read",), "?since=1e400", 422, "finite"),
        (("fleet:read",), "?since=Infinity", 422, "finite"),
        (("fleet:read",), "?since=-1", 422, "greater than or equal"),
        (("fleet:read",), "?since=yesterday", 422, "valid number"),
        (("fleet:read",), "?since=1e9", 200, '"events":[]'),
    ],
)
async def test_events_refusals_and_bad_since(
    scopes: tuple[str, ...] | None, query: str, status: int, says: str
) -> None:
    clock = FakeClock(dt.datetime(2026, 3, 2, 12, tzinfo=dt.UTC))
    state = ContractServer("rpa_" + secrets.token_hex(12), clock=clock.now)
    async with fleet_on_contract(state, clock, WARM_TIERS) as orch:
        auth = {}
        if scopes:
            auth = {"Authorization": f"Bearer {mint(orch.keys, scopes, 'orchestrator')}"}
        async with (
            serving_here(create_app(orch)) as url,
            httpx.AsyncClient(base_url=url) as http,
        ):
            events = await http.get("/v1/events" + query, headers=auth)
            history = await http.get("/v1/history", headers=auth)

    assert events.status_code == status, events.text
    assert says in events.text.replace(" ", "") if status == 200 else says in events.text
    assert "Traceback" not in events.text and "yesterday" not in events.text
    if status in (401, 403):
        assert history.status_code == status
