"""Acceptance 3 (spot): a spot pod vanishes (preempted) on the RunPod contract
server; its streams move to on-demand within 15 s; critical never on spot.
The contract server backs each pod with a real local worker process started
from the pod's env as RunPod gives it: the public key set and the pod's own
certificate (no signing key, no shared secret); the ingest reaches it over
wss:// verified against the orchestrator's CA and the pod's name."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from bench.rig.runpod_contract import ContractState, running_contract_server
from deploy.models import StreamSpec
from deploy.providers.runpod import RunPodProvider
from deploy.settings import RunPodSettings, TierConfig
from framerelay.launcher import LocalWorker
from tests.conftest import CLIP, MODEL, TIMEOUT_FACTOR
from tests.faults.fleet_harness import running_fleet, settings_for, wait_for
from tests.support.auth import ed_keys

pytestmark = [pytest.mark.integration, pytest.mark.slow]
KEY = "rpa_" + "Sp0tT3stK3y" * 3
MOVE_LIMIT_S = 15.0


def _launch(pod: dict[str, Any]) -> tuple[str, int, Any]:
    env = dict(pod["env"])  # what the container would see
    assert "FRAMERELAY_TOKEN_SECRETS" not in env and "FRAMERELAY_SIGNING_KEYS" not in env
    env.pop("FRAMERELAY_WORKER_HOST", None)
    worker = LocalWorker(
        None, worker_id=env.pop("FRAMERELAY_WORKER_WORKER_ID"), env=env,
        args=["--model", str(MODEL), "--threads", "1", "--host", "127.0.0.1"],
    )  # fmt: skip
    worker.start(120 * TIMEOUT_FACTOR)
    port = int(worker.url.rsplit(":", 1)[1].split("/")[0])

    def stop() -> None:  # the container dies at once, like a preempted machine
        worker.kill()
        worker.stop()

    return "127.0.0.1", port, stop


def test_spot_pod_vanishes_and_its_streams_move(secret: str, tmp_path: Path) -> None:
    state = ContractState(KEY)
    state.launcher = _launch
    tiers = [
        TierConfig(name="ondemand", min_warm=1, max_workers=1, capacity_fps=12),
        TierConfig(name="spot", spot=True, min_warm=1, max_workers=1, capacity_fps=12,
                   cloud_types=("COMMUNITY",)),
    ]  # fmt: skip
    streams = [
        StreamSpec(id="crit", url=str(CLIP), fps=3, loop=True, priority="critical"),
        StreamSpec(id="std-1", url=str(CLIP), fps=3, loop=True),
        StreamSpec(id="std-2", url=str(CLIP), fps=3, loop=True),
    ]

    async def main(base: str) -> tuple[float, dict[str, str], dict[str, str], Any]:
        rp = RunPodProvider(RunPodSettings(api_key=SecretStr(KEY), base_url=base, backoff_s=0.05))
        settings = settings_for(
            secret, tmp_path / "ca", keys=ed_keys(), tiers=tiers, provider="runpod"
        )
        async with running_fleet(settings, provider=rp) as fleet:
            for s in streams:
                await fleet.orch.store.put_stream(s)

            async def placed_on_spot() -> bool:
                a = await fleet.orch.store.assignments()
                return (
                    a.get("std-1", "").startswith("fr-spot")
                    and a.get("std-2", "").startswith("fr-spot")
                    and all(fleet.results_for(s.id) for s in streams)
                )

            await wait_for(placed_on_spot, 120, "standard streams flowing on spot")
            for rec in (await fleet.orch.store.pods()).values():  # results came over verified wss
                assert rec.tunnel_url is not None and rec.tunnel_url.startswith("wss://")
                assert rec.tls_server_name == f"{rec.name}.pods.framerelay"
            before = await fleet.orch.store.assignments()
            spot_id = next(p["id"] for p in state.pods.values() if p["interruptible"])
            t0 = time.time()
            state.preempt(spot_id)  # vanishes, as a preempted spot pod

            def moved() -> bool:
                return all(
                    any(r.received_at > t0 and not r.worker_id.startswith("fr-spot")
                        for r in fleet.results_for(s)) for s in ("std-1", "std-2")
                )  # fmt: skip

            await wait_for(moved, 30, "standard streams on on-demand")
            took = max(
                min(r.received_at for r in fleet.results_for(s) if r.received_at > t0) - t0
                for s in ("std-1", "std-2")
            )
            after = await fleet.orch.store.assignments()
            return took, before, after, list(fleet.records)

    with running_contract_server(state) as base:
        try:
            took, before, after, records = asyncio.run(main(base))
        finally:
            time.sleep(0.5)  # let a replacement that is still booting register
            for pod_id in list(state.pods):
                state.remove(pod_id)
    print(f"\nspot pod preempted: standard streams moved {before} -> {after} in {took:.2f} s")
    assert took <= MOVE_LIMIT_S * TIMEOUT_FACTOR
    assert all(not r.worker_id.startswith("fr-spot") for r in records if r.stream_id == "crit")
    assert after["std-1"].startswith("fr-ondemand") and after["std-2"].startswith("fr-ondemand")
    assert not state.key_in_url
