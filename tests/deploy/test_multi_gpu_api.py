"""The orchestrator's API over a two-GPU pod (issue 17): a stream can be moved to the
pod's second worker, the pod view lists the streams of every one of its workers, and
the fleet history counts them as placed. The real fleet logic against the RunPod API v2
contract server and a real Redis, with a fake clock."""

from __future__ import annotations

import datetime as dt
import secrets

import httpx
import pytest

from bench.rig.runpod_v2_contract import ContractServer
from deploy.api import create_app
from deploy.clock import FakeClock
from deploy.models import StreamSpec
from deploy.settings import TierConfig
from tests.support.auth import mint
from tests.support.contract_fleet import GPU, fleet_on_contract, passes
from tests.support.orchestrator import serving_here

pytestmark = pytest.mark.integration
TIERS = (TierConfig(name="big", gpu_count=2, min_warm=1, max_workers=1, capacity_fps=20,
                    gpu_types=(GPU,)),)  # fmt: skip


async def test_streams_move_to_and_show_on_every_worker_of_a_two_gpu_pod() -> None:
    clock = FakeClock(dt.datetime(2026, 3, 2, 12, tzinfo=dt.UTC))
    state = ContractServer("rpa_" + secrets.token_hex(12), clock=clock.now)
    async with fleet_on_contract(state, clock, TIERS) as orch:
        await passes(orch, clock, 3)  # the warm pod: both workers ready
        for sid in ("cam-a", "cam-b"):
            await orch.store.put_stream(StreamSpec(id=sid, url=f"rtsp://127.0.0.1:1/{sid}"))
        await passes(orch, clock, 2)
        (pod,) = (await orch.store.pods()).values()
        second = f"{pod.name}-gpu1"
        async with serving_here(create_app(orch)) as url, httpx.AsyncClient() as http:
            write = {"Authorization": "Bearer " + mint(orch.keys, ["fleet:*"], "orchestrator")}
            moved_resp = await http.post(
                f"{url}/v1/streams/cam-a/move", headers=write, json={"worker": second}
            )
            unknown_resp = await http.post(
                f"{url}/v1/streams/cam-a/move", headers=write, json={"worker": f"{pod.name}-gpu7"}
            )
            await passes(orch, clock, 2)
            (view,) = (await http.get(f"{url}/v1/pods", headers=write)).json()
            history = (await http.get(f"{url}/v1/history", headers=write)).json()
        moved, unknown = moved_resp.status_code, unknown_resp.status_code
        placed: list[float] = history["streams_placed"]
        assigned: dict[str, str] = await orch.store.assignments()

    assert moved == 200 and unknown == 404
    assert assigned["cam-a"] == f"{view['name']}-gpu1"  # the pin took effect
    assert set(assigned.values()) <= {f"{view['name']}-gpu0", f"{view['name']}-gpu1"}
    assert view["streams"] == ["cam-a", "cam-b"]  # on either worker, listed on the pod
    assert placed[-1] == 2
