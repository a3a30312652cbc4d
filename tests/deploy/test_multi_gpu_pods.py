"""Acceptance (issue 17): a two-GPU pod runs two workers and receives streams on both.

The whole fleet runs for real (orchestrator, Redis, ingest behind its HTTP API) and
the pod is started by its own entrypoint, ``framerelay worker --gpus 2``: one worker
process per "GPU" (on this machine the CPU ONNX model), each on its own port and
token scope (``worker:<pod>-gpu<i>``). Once with the RunPod API v2 contract server,
where the container's arguments come from the create body's ``args`` and the ports
from the pod's ``runtime.ports``; once with the local provider."""

from __future__ import annotations

import collections
import os
import shlex
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from bench.rig.runpod_v2_contract import ContractServer, running_runpod_v2
from deploy.models import StreamSpec
from deploy.providers.base import Provider
from deploy.providers.runpod.provider import RunPodProvider
from deploy.settings import RunPodSettings, TierConfig
from tests.conftest import CLIP
from tests.support.auth import ed_keys
from tests.support.fleet import Fleet, running_fleet, settings_for
from tests.support.runpod import add_template, launch_worker
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.integration  # functional (no timing figure asserted): runs in parallel
KEY = "rpa_" + "Tw0GpuK3y" * 3
POD = "fr-big-0-g0"
WORKERS = (f"{POD}-gpu0", f"{POD}-gpu1")
# one worker holds one stream: 4 fps x target utilization 0.8 = 3.2 fps of room
TIER = TierConfig(name="big", gpu_count=2, min_warm=1, max_workers=1, capacity_fps=4)
RESULTS = 5
"""Results each stream must bring back from its worker."""
STREAMS = [StreamSpec(id=f"cam-{i}", url=str(CLIP), fps=3, loop=True) for i in range(2)]


async def _streams_on_both_workers(fleet: Fleet) -> tuple[dict[str, str], dict[str, int]]:
    """Both streams placed, one per worker, each with results from its worker; prints how
    long the pod took from its create to both workers ready (canaries passed)."""
    for s in STREAMS:
        await fleet.orch.store.put_stream(s)

    async def flowing() -> bool:
        assigned = await fleet.orch.store.assignments()
        return sorted(assigned.values()) == list(WORKERS) and all(
            sum(r.worker_id == assigned[s.id] for r in fleet.results_for(s.id)) >= RESULTS
            for s in STREAMS
        )

    await wait_until_async(flowing, 180, "a stream on each worker of the two-GPU pod")
    pods = await fleet.orch.store.pods()
    assert list(pods) == [POD] and pods[POD].gpu_count == 2 and pods[POD].ready
    assert [w.name for w in pods[POD].workers()] == list(WORKERS)
    ready_since = pods[POD].ready_since
    assert ready_since is not None
    print(f"\ntwo-GPU pod: create -> both workers ready {ready_since - pods[POD].created_at:.1f} s")
    per_worker = collections.Counter(r.worker_id for r in fleet.records)
    return await fleet.orch.store.assignments(), dict(per_worker)


def _check(assigned: dict[str, str], results: dict[str, int]) -> None:
    print(f"\ntwo-GPU pod: streams {assigned}; results per worker {results}")
    assert set(assigned.values()) == set(WORKERS)  # one stream on each GPU's worker
    assert all(results.get(w, 0) >= RESULTS for w in WORKERS)


def _launch(pod: dict[str, Any]) -> tuple[str, dict[int, int], Any]:
    """The container: ``framerelay worker --gpus 2`` from the pod's ``args``, one public
    port per exposed port (a worker per GPU)."""
    assert shlex.split(pod["args"]) == ["worker", "--gpus", "2"], pod["args"]
    return launch_worker(pod)


@pytest.mark.parametrize("template", [False, True], ids=["image", "template"])
async def test_a_two_gpu_runpod_pod_runs_two_workers_with_a_stream_each(
    template: bool, secret: str, tmp_path: Path
) -> None:
    """With ``template``: the tier names a RunPod template made from the worker image,
    which supplies the image, disk and a shared setting; the pod still brings its own
    env (keys, certificate, worker id), two GPUs, two ports and ``worker --gpus 2``."""
    server = ContractServer(KEY, launcher=_launch)

    with running_runpod_v2(server) as base:
        tier = TIER
        if template:
            made = add_template(
                base,
                KEY,
                name="framerelay-worker",
                image="framerelay/worker:0.1.0",
                disk=20,
                ports=["8443/tcp"],
                env={"FRAMERELAY_WORKER_MAX_BATCH": "4"},
            )
            tier = TIER.model_copy(update={"template_id": made["id"]})
        rp: Provider = RunPodProvider(
            RunPodSettings(api_key=SecretStr(KEY), base_url=base, backoff_s=0.05)
        )
        settings = settings_for(
            secret, tmp_path / "ca", keys=ed_keys(), tiers=[tier], provider="runpod"
        )
        async with running_fleet(settings, provider=rp) as fleet:
            assigned, results = await _streams_on_both_workers(fleet)
        (pod,) = (server.pod_view(p) for p in server.pods.values())
    assert pod["gpu"]["count"] == 2 and pod["ports"] == ["8443/tcp", "8444/tcp"]
    if template:
        assert pod["image"] == "framerelay/worker:0.1.0"
        assert pod["env"]["FRAMERELAY_WORKER_MAX_BATCH"] == "4"
        assert pod["env"]["FRAMERELAY_WORKER_WORKER_ID"] == POD
    assert server.violations == [] and server.client_errors == [] and not server.key_in_url
    _check(assigned, results)


async def test_a_two_gpu_local_pod_runs_two_workers_with_a_stream_each(
    secret: str, tmp_path: Path
) -> None:
    settings = settings_for(secret, tmp_path / "ca", tiers=[TIER])
    async with running_fleet(settings) as fleet:
        out = await _streams_on_both_workers(fleet)
        (pod,) = fleet.provider.pods.values()
        assert len(pod.worker.infos) == 2

    _check(*out)


async def test_a_dead_worker_takes_its_pod_down_and_both_streams_come_back(
    secret: str, tmp_path: Path
) -> None:
    """kill -9 one GPU's worker: the pod's supervisor stops the other and exits, the
    provider says EXITED (or the dead worker's failed probes say it first), the
    orchestrator replaces the pod and both streams run again on the new pod's two
    workers."""

    settings = settings_for(secret, tmp_path / "ca", tiers=[TIER])
    async with running_fleet(settings) as fleet:
        await _streams_on_both_workers(fleet)
        (pod,) = fleet.provider.pods.values()
        t0 = time.time()
        os.kill(int(pod.worker.infos[1]["pid"]), signal.SIGKILL)
        new = ("fr-big-0-g1-gpu0", "fr-big-0-g1-gpu1")

        def back() -> bool:
            return all(
                any(r.received_at > t0 and r.worker_id in new for r in fleet.results_for(s.id))
                for s in STREAMS
            )

        await wait_until_async(back, 120, "both streams on the replacement pod's workers")
        # the supervisor exits once it stopped the other worker (EXITED: "exited"); on a
        # busy machine the dead worker's failed probes may replace the pod first
        kinds = [e["kind"] for e in fleet.orch.fleet.events]
        assert {"exited", "replaced"} & set(kinds), kinds
        took = time.time() - t0

    print(f"\ntwo-GPU pod: one worker killed -> both streams on a new pod in {took:.1f} s")
