"""Multi-GPU pods without processes: one worker per GPU in the records, the slots
placement sees, health per worker, and the scaler counting pods of N workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from pydantic import ValidationError

from deploy.clock import FakeClock
from deploy.fleet import Fleet
from deploy.health import Probe
from deploy.models import Endpoint, PodInfo, PodRecord, PodSpec, PodStatus, StreamSpec
from deploy.providers.base import GpuPrice
from deploy.providers.kubernetes.render import render_pod_objects, worker_ports
from deploy.scaling import tier_targets
from deploy.settings import KubernetesSettings, OrchestratorSettings, TierConfig
from tests.deploy.k8s_checks import deployment_problems, schema_problems, service_problems
from tests.support.orchestrator import orch_settings

PRICES = {"NVIDIA RTX A4000": GpuPrice("NVIDIA RTX A4000", 0.32, 0.2, 0.13, 0.1)}
NOON = 1_772_452_800.0  # a Monday, 12:00 UTC


def _streams(n: int, fps: float = 5.0) -> list[StreamSpec]:
    return [StreamSpec(id=f"s{i}", url="x", fps=fps) for i in range(n)]


def _pod(gpus: int = 2, **over: Any) -> PodRecord:
    base: dict[str, Any] = {
        "name": "fr-big-0-g0",
        "tier": "big",
        "slot": 0,
        "gen": 0,
        "spot": False,
        "state": "running",
        "provider_id": "p",
        "gpu_count": gpus,
        "cost_per_hr": 0.64,
    }
    return PodRecord(**{**base, **over})


def _fleet(tmp_path: Path, **tier: Any) -> Fleet:
    none = cast(Any, None)  # _slots / _apply_probe touch neither provider, store nor links
    tiers = [TierConfig(name="big", gpu_count=2, max_workers=2, **tier)]
    settings = orch_settings(tmp_path, unhealthy_after=2, tiers=tiers)
    return Fleet(settings, none, none, none, none, FakeClock(1000.0))


def test_a_pod_has_one_named_worker_per_gpu_and_one_gpu_pods_are_their_own() -> None:
    two = _pod()
    assert [w.name for w in two.workers()] == ["fr-big-0-g0-gpu0", "fr-big-0-g0-gpu1"]
    one = _pod(gpus=1)
    assert one.workers() == [one]
    info = PodInfo(id="p", name=two.name, status=PodStatus.RUNNING, tls_server_name="t")
    info.set_endpoints(
        (Endpoint("ws://h:1/v1/tunnel", "http://h:1"), Endpoint("ws://h:2/v1/tunnel", "http://h:2"))
    )
    two.set_endpoint(info)
    assert [w.tunnel_url for w in two.workers()] == ["ws://h:1/v1/tunnel", "ws://h:2/v1/tunnel"]
    assert all(w.tls_server_name == "t" for w in two.workers())  # one certificate per pod
    assert two.tunnel_url == "ws://h:1/v1/tunnel"
    back = PodRecord.model_validate_json(two.model_dump_json())  # as kept in Redis
    assert [w.http_url for w in back.workers()] == ["http://h:1", "http://h:2"]


def test_placement_sees_each_ready_gpu_with_its_share_of_the_price(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path)
    rec = _pod()
    gpu0, gpu1 = rec.workers()
    gpu0.ready, gpu0.capacity_fps = True, 10.0
    slots = fleet._slots({rec.name: rec})
    assert [(s.name, s.capacity, s.cost_per_hr) for s in slots] == [
        ("fr-big-0-g0-gpu0", 8.0, 0.32)  # capacity x target_utilization 0.8; price / 2 GPUs
    ]
    gpu1.ready, gpu1.capacity_fps = True, 20.0
    assert [s.capacity for s in fleet._slots({rec.name: rec})] == [8.0, 16.0]


def test_health_is_per_worker_and_one_failed_worker_replaces_the_pod(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path)
    rec = _pod(created_at=900.0)
    gpu0, gpu1 = rec.workers()
    passed = Probe(alive=True, canary_ok=True, persons=5, canary_ms=40.0, capacity_fps=12.0)
    fleet._apply_probe(gpu0, passed, 1000.0)
    rec.sum_up()
    assert gpu0.ready and not gpu1.ready and not rec.ready  # a pod is ready when all are
    assert [e["pod"] for e in fleet.events if e["kind"] == "ready"] == ["fr-big-0-g0-gpu0"]
    fleet._apply_probe(gpu1, passed, 1001.0)
    rec.sum_up()
    assert rec.ready and rec.capacity_fps == 24.0
    failed = Probe(alive=False, error="heartbeat failed")
    for t in (1002.0, 1004.0):
        fleet._apply_probe(gpu1, failed, t)
        rec.sum_up()
    assert gpu0.ready and not gpu1.ready
    assert fleet._unhealthy(rec, 1004.0)  # the provider rents pods: the pod goes
    assert rec.last_error == "fr-big-0-g0-gpu1: heartbeat failed"


def test_a_worker_never_ready_within_the_grace_replaces_its_pod(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path)
    rec = _pod(created_at=0.0)
    rec.workers()[0].ready = True
    grace = fleet.settings.startup_grace_s
    assert not fleet._unhealthy(rec, grace - 1)
    assert fleet._unhealthy(rec, grace + 1)


@pytest.mark.parametrize(("streams", "pods"), [(0, 1), (6, 1), (7, 2), (12, 2), (13, 3)])
def test_the_scaler_counts_pods_of_gpu_count_workers(streams: int, pods: int) -> None:
    # 3 streams of 5 fps per worker (20 x 0.8 = 16), 2 workers per pod
    settings = OrchestratorSettings(
        tiers=[TierConfig(name="big", gpu_count=2, min_warm=1, max_workers=4, capacity_fps=20)]
    )
    assert tier_targets(settings, _streams(streams), {}, PRICES, NOON) == {"big": pods}


def test_measured_capacity_is_per_worker_not_per_pod() -> None:
    settings = OrchestratorSettings(
        tiers=[TierConfig(name="big", gpu_count=2, min_warm=0, max_workers=4)]
    )
    rec = _pod()
    for w in rec.workers():
        w.ready, w.capacity_fps = True, 10.0  # 8 fps room each: one 5 fps stream per worker
    rec.sum_up()
    assert tier_targets(settings, _streams(4), {rec.name: rec}, PRICES, NOON) == {"big": 2}


def test_pod_specs_and_tiers_carry_gpus_and_template() -> None:
    spec = PodSpec(name="p", tier="t", gpu_types=("g",), spot=False, gpu_count=3)
    assert spec.ports == [8443, 8444, 8445]
    assert spec.worker_args == ["worker", "--gpus", "3"]
    assert PodSpec(name="p", tier="t", gpu_types=("g",), spot=False).worker_args == ["worker"]
    for bad in ({"gpu_count": 0}, {"gpu_count": 9}, {"template_id": "has space"}):
        with pytest.raises(ValidationError):
            TierConfig(name="t", **bad)


def test_kubernetes_renders_a_two_gpu_pod_with_a_port_per_worker() -> None:
    """A pod's workers, its Service's ports and its policy's (the endpoints the provider
    makes of them: tests/deploy/test_k8s_provider*.py against the contract API server)."""
    env = {"FRAMERELAY_WORKER_WORKER_ID": "fr-big-0-g0"}
    spec = PodSpec(
        name="fr-big-0-g0", tier="big", gpu_types=("L4",), spot=False, gpu_count=2, env=env
    )
    settings = KubernetesSettings(image="reg/worker:1")
    policy, service, pod = render_pod_objects(spec, settings)
    (container,) = pod["spec"]["containers"]
    assert container["args"][:3] == ["worker", "--gpus", "2"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert worker_ports(pod) == [8443, 8444]
    assert [p["port"] for p in service["spec"]["ports"]] == [8443, 8444]
    assert [p["port"] for p in policy["spec"]["ingress"][0]["ports"]] == [8443, 8444]
    assert [p for d in (policy, service, pod) for p in schema_problems(d)] == []
    assert deployment_problems(pod) == [] and service_problems(service, [pod]) == []
