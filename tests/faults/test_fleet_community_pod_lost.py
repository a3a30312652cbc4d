"""A community-cloud pod is lost with its host (RunPod's API v2 has no spot pods: the
community cloud is its cheaper capacity): on the RunPod API v2 contract server it
vanishes, its worker killed at once; its streams move to the on-demand worker within
15 s. The contract server backs each pod with a real local worker process started from
the pod's env as RunPod gives it: the public key set and the pod's own certificate (no
signing key, no shared secret); the ingest reaches it over wss:// verified against the
orchestrator's CA and the pod's name."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from bench.rig.runpod_v2_contract import ContractServer, running_runpod_v2
from deploy.models import StreamSpec
from deploy.providers.runpod.provider import RunPodProvider
from deploy.settings import RunPodSettings, TierConfig
from tests.conftest import CLIP, TIMEOUT_FACTOR
from tests.support.auth import ed_keys
from tests.support.fleet import running_fleet, settings_for
from tests.support.runpod import Stop, launch_worker
from tests.support.waiting import wait_until_async

pytestmark = [pytest.mark.integration, pytest.mark.slow]
KEY = "rpa_" + "C0mmun1tyK3y" * 3
MOVE_LIMIT_S = 15.0


def _launch(pod: dict[str, Any]) -> tuple[str, dict[int, int], Stop]:
    return launch_worker(pod, kill=True)  # the container dies at once with its host


async def test_a_community_pod_vanishes_and_its_streams_move(secret: str, tmp_path: Path) -> None:
    server = ContractServer(KEY, launcher=_launch)
    tiers = [
        TierConfig(name="ondemand", min_warm=1, max_workers=1, capacity_fps=12),
        TierConfig(
            name="community",
            min_warm=1,
            max_workers=1,
            capacity_fps=12,
            cloud_types=("COMMUNITY",),
        ),
    ]
    streams = [
        StreamSpec(id="crit", url=str(CLIP), fps=3, loop=True, priority="critical"),
        StreamSpec(id="std-1", url=str(CLIP), fps=3, loop=True),
        StreamSpec(id="std-2", url=str(CLIP), fps=3, loop=True),
    ]

    with running_runpod_v2(server) as base:
        rp = RunPodProvider(RunPodSettings(api_key=SecretStr(KEY), base_url=base, backoff_s=0.05))
        settings = settings_for(
            secret,
            tmp_path / "ca",
            keys=ed_keys(),
            tiers=tiers,
            provider="runpod",
        )
        async with running_fleet(settings, provider=rp) as fleet:
            for s in streams:
                await fleet.orch.store.put_stream(s)

            async def flowing_on_community() -> bool:
                a = await fleet.orch.store.assignments()
                return any(w.startswith("fr-community") for w in a.values()) and all(
                    fleet.results_for(s.id) for s in streams
                )

            await wait_until_async(
                flowing_on_community, 120, "streams flowing, some on the community pod"
            )
            for rec in (await fleet.orch.store.pods()).values():  # results came over verified wss
                assert rec.tunnel_url is not None and rec.tunnel_url.startswith("wss://")
                assert rec.tls_server_name == f"{rec.name}.pods.framerelay"
            before = await fleet.orch.store.assignments()
            moving = [s for s, w in before.items() if w.startswith("fr-community")]
            lost = next(p.id for p in server.pods.values() if p.name.startswith("fr-community"))
            t0 = time.time()
            server.vanish(lost)  # its host is lost: the pod is gone, its worker killed

            def moved() -> bool:
                return all(
                    any(
                        r.received_at > t0 and r.worker_id.startswith("fr-ondemand")
                        for r in fleet.results_for(s)
                    )
                    for s in moving
                )

            await wait_until_async(moved, 30, "the lost pod's streams on on-demand")
            took = max(
                min(r.received_at for r in fleet.results_for(s) if r.received_at > t0) - t0
                for s in moving
            )
            after = await fleet.orch.store.assignments()
    print(f"\ncommunity pod lost: streams {moving} moved {before} -> {after} in {took:.2f} s")
    assert moving and took <= MOVE_LIMIT_S * TIMEOUT_FACTOR
    assert all(after[s].startswith("fr-ondemand") for s in moving)
    assert server.violations == [] and server.client_errors == [] and not server.key_in_url
