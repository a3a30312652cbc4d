"""Issue 31: the Kubernetes provider and its pod watch, in process, against the contract
API server (tests/support/k8s_api: every object validated against the Kubernetes OpenAPI
schemas, a scheduler with taints, watches with resourceVersion and 410).

Containers here run no process (the contract kubelet marks them running and ready at
once); tests/deploy/test_k8s_scenarios.py runs real workers behind a real orchestrator."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError
from lightkube.models.meta_v1 import Status
from pydantic import ValidationError

from deploy.ca import PodCA
from deploy.clock import FakeClock
from deploy.models import PodInfo, PodSpec, PodStatus
from deploy.pod_trust import PodTrust
from deploy.providers.base import NoCapacityError, ProviderError
from deploy.providers.kubernetes.client import KubeApi, api_error
from deploy.providers.kubernetes.provider import STALE_S, KubernetesProvider
from deploy.providers.kubernetes.render import MANAGED, render_pod_objects
from deploy.providers.kubernetes.watch import PodWatch
from deploy.settings import KubernetesSettings, TierConfig
from framerelay.errors import ConfigError
from tests.conftest import ROOT
from tests.support.auth import ed_keys
from tests.support.k8s_api import GPU_TAINT, K8sContractServer, NodeSpec
from tests.support.k8s_api.rbac import role_rules
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.integration
ROLE = role_rules(ROOT / "deploy" / "k8s" / "base" / "orchestrator.yaml", "framerelay-orchestrator")
"""The orchestrator's Role in deploy/k8s: the server refuses (403) what it does not allow."""
GPU_NODE = NodeSpec(
    "gpu-a",
    taints=(GPU_TAINT,),
    allocatable={"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "8", "pods": "110"},
)
GRACE_S = 60.0
SECRET_KINDS = ("Pod", "Service", "NetworkPolicy", "Secret")


@contextmanager
def cluster(*nodes: NodeSpec) -> Iterator[K8sContractServer]:
    with K8sContractServer(nodes=nodes or (GPU_NODE,), rules=ROLE) as k8s:
        yield k8s
        assert k8s.violations() == [], k8s.violations()
        assert k8s.client_errors == [], k8s.client_errors


def settings(k8s: K8sContractServer, tmp_path: Path, **over: Any) -> KubernetesSettings:
    kubeconfig = k8s.write_kubeconfig(tmp_path / "kubeconfig")
    base: dict[str, Any] = {
        "kubeconfig": kubeconfig,
        "address": "pod-ip",
        "unschedulable_grace_s": GRACE_S,
    }
    return KubernetesSettings(**{**base, **over})


@asynccontextmanager
async def provider(
    k8s: K8sContractServer, tmp_path: Path, clock: FakeClock | None = None, **over: Any
) -> AsyncIterator[KubernetesProvider]:
    tiers = [TierConfig(name="gpu", min_warm=2, max_workers=4)]
    made = KubernetesProvider(settings(k8s, tmp_path, **over), clock or FakeClock(0), tiers)
    try:
        yield made
    finally:
        await made.aclose()


def spec(tmp_path: Path, name: str, tier: str = "gpu", gpus: int = 1) -> PodSpec:
    """A pod as the fleet asks for it: its own certificate and key (TLS)."""
    trust = PodTrust(ed_keys(), ca=PodCA.load_or_create(tmp_path / "ca"))
    creds = trust.for_pod(name)
    return PodSpec(
        name=name,
        tier=tier,
        gpu_types=(),
        spot=False,
        env={**creds.env, "FRAMERELAY_WORKER_WORKER_ID": name},
        secret_env=creds.secret_env,
        tls_server_name=creds.tls_server_name,
        gpu_count=gpus,
    )


async def listed(
    made: KubernetesProvider, name: str, status: PodStatus, reason: str = ""
) -> PodInfo:
    """The pod as the provider lists it, once it has ``status`` (and a reason starting
    with ``reason``; bounded wait)."""
    found: dict[str, PodInfo] = {}

    async def there() -> bool:
        found.update({p.name: p for p in await made.list()})
        info = found.get(name)
        return info is not None and info.status is status and (info.reason or "").startswith(reason)

    await wait_until_async(there, 20, lambda: f"{name} {status.name}: {found.get(name)}")
    return found[name]


def names(k8s: K8sContractServer, kind: str) -> set[str]:
    return {o["metadata"]["name"] for o in k8s.objects(kind, "framerelay")}


async def test_a_pod_is_applied_server_side_and_read_from_the_watch(tmp_path: Path) -> None:
    with cluster() as k8s:
        async with provider(k8s, tmp_path) as made:
            assert await made.list() == []
            created = await made.create(spec(tmp_path, "fr-gpu-0-g0", gpus=2))
            assert created.status is PodStatus.PROVISIONING
            info = await listed(made, "fr-gpu-0-g0", PodStatus.RUNNING)
        pod = k8s.pod("fr-gpu-0-g0")
        assert pod is not None
        ip = pod["status"]["podIP"]
        assert [e.http_url for e in info.endpoints] == [
            f"https://{ip}:8443",
            f"https://{ip}:8444",
        ]
        assert info.tunnel_url == f"wss://{ip}:8443/v1/tunnel"
        assert info.tls_server_name == "fr-gpu-0-g0.pods.framerelay"
        for kind in SECRET_KINDS:
            (obj,) = k8s.objects(kind, "framerelay")
            managers = {(m["manager"], m["operation"]) for m in obj["metadata"]["managedFields"]}
            assert ("framerelay-orchestrator", "Apply") in managers, (kind, managers)
            annotations = obj["metadata"].get("annotations") or {}
            assert "kubectl.kubernetes.io/last-applied-configuration" not in annotations
        (budget,) = k8s.objects("PodDisruptionBudget", "framerelay")
        assert budget["spec"]["minAvailable"] == 2  # the tier's warm minimum
        assert k8s.creates == {"framerelay/fr-gpu-0-g0": 1}


async def test_unschedulable_is_said_then_no_capacity_after_the_grace(tmp_path: Path) -> None:
    """A profile without the GPU taint's toleration: the scheduler's message, then, once
    the grace has passed on the orchestrator's clock, no capacity."""
    untolerated = {"plain": {"base": None}}

    with cluster() as k8s:
        clock = FakeClock(1000)
        async with provider(k8s, tmp_path, clock, profiles=untolerated) as made:
            await made.create(spec(tmp_path, "fr-plain-0-g0", tier="plain"))
            first = await listed(made, "fr-plain-0-g0", PodStatus.PROVISIONING, "Unschedulable")
            clock.advance(GRACE_S - 1)
            waiting = (await made.list())[0]
            clock.advance(1)
            gone = (await made.list())[0]
    assert first.reason is not None and first.reason.startswith("Unschedulable: 0/1 nodes")
    assert "untolerated taint {nvidia.com/gpu: present}" in first.reason
    assert waiting.status is PodStatus.PROVISIONING and waiting.reason == first.reason
    assert gone.status is PodStatus.NO_CAPACITY
    assert gone.reason is not None and gone.reason.startswith(f"no node for {GRACE_S:.0f} s: ")
    assert first.reason.startswith(gone.reason.removeprefix(f"no node for {GRACE_S:.0f} s: ")[:-1])


async def test_terminate_deletes_every_object_and_a_lost_pod_leaves_none(tmp_path: Path) -> None:
    with cluster() as k8s:
        async with provider(k8s, tmp_path) as made:
            for name in ("fr-gpu-0-g0", "fr-gpu-1-g0"):
                await made.create(spec(tmp_path, name))
                await listed(made, name, PodStatus.RUNNING)
            await made.terminate("fr-gpu-0-g0")
            assert "fr-gpu-0-g0" not in {p.name for p in await made.list()}
            assert await made.get("fr-gpu-0-g0") is None
            # the pod object lasts until its kubelet has stopped it
            await wait_until_async(
                lambda: all(names(k8s, kind) == {"fr-gpu-1-g0"} for kind in SECRET_KINDS),
                30,
                "every object of fr-gpu-0-g0 deleted",
            )
            k8s.lose_node("gpu-a")  # the node and its pods are gone: nobody terminates it
            await wait_until_async(
                lambda: not any(names(k8s, k) for k in SECRET_KINDS), 10, "swept"
            )
            assert await made.list() == []


async def test_the_watch_resumes_from_its_version_and_lists_again_after_410(tmp_path: Path) -> None:
    """Stopped and started again, the watch resumes from the version it had (no list);
    once the server's history no longer reaches that version (compacted), it gets 410
    and lists again, which also shows a pod deleted while it was away."""

    with cluster() as k8s:
        kube = settings(k8s, tmp_path)
        api = KubeApi(kube)
        watch = PodWatch(api, MANAGED)
        try:
            watch.start()
            await asyncio.wait_for(watch.synced.wait(), 10)
            await watch.aclose()
            for obj in render_pod_objects(spec(tmp_path, "fr-gpu-0-g0"), kube):
                await api.apply(obj)
            watch.start()  # resumes: the ADDED event of the pod made while it was away
            await wait_until_async(lambda: "fr-gpu-0-g0" in watch.pods, 10, "resumed")
            assert (watch.lists, watch.resumes) == (1, 1)
            k8s.drop_watches()  # the server ends the stream: taken up again
            for obj in render_pod_objects(spec(tmp_path, "fr-gpu-1-g0"), kube):
                await api.apply(obj)
            await wait_until_async(lambda: "fr-gpu-1-g0" in watch.pods, 10, "after a drop")
            assert watch.lists == 1
            await watch.aclose()
            await api.delete_pod_objects("fr-gpu-0-g0")
            k8s.compact()
            watch.start()
            await wait_until_async(lambda: watch.lists == 2, 10, "listed again")
            assert set(watch.pods) == {"fr-gpu-1-g0"} and watch.failing is None
            assert k8s.rest.expired_watches == 1
        finally:
            await watch.aclose()
            await api.aclose()
        assert k8s.creates == {"framerelay/fr-gpu-0-g0": 1, "framerelay/fr-gpu-1-g0": 1}


async def test_a_watch_failing_for_long_fails_the_pass_instead_of_a_stale_cache(
    tmp_path: Path,
) -> None:
    """The API server goes away: the pods last seen are listed while the watch retries,
    until it has failed for STALE_S on the orchestrator's clock."""

    clock = FakeClock(0)
    with cluster() as k8s:
        made = KubernetesProvider(settings(k8s, tmp_path), clock)
        await made.create(spec(tmp_path, "fr-gpu-0-g0"))
        await listed(made, "fr-gpu-0-g0", PodStatus.RUNNING)
    try:
        await wait_until_async(lambda: made.watch.broken is not None, 10, "the watch broken")
        assert [p.name for p in await made.list()] == ["fr-gpu-0-g0"]
        clock.advance(STALE_S + 1)
        with pytest.raises(ProviderError) as stale:
            await made.list()
    finally:
        await made.aclose()
    said = str(stale.value)

    assert said.startswith(f"the pod watch has failed for {STALE_S + 1:.0f} s: "), said


async def test_a_broken_api_fails_the_pass_in_one_line(tmp_path: Path) -> None:
    with cluster() as k8s:
        kube = k8s.write_kubeconfig(tmp_path / "kubeconfig")
        kube.write_text(kube.read_text().replace(k8s.token, "not-the-token"))
        made = KubernetesProvider(KubernetesSettings(kubeconfig=kube))
        try:
            with pytest.raises(ProviderError) as failed:
                await made.create(spec(tmp_path, "fr-gpu-0-g0"))
        finally:
            await made.aclose()
        said = str(failed.value)
    assert said.startswith("apply Secret/fr-gpu-0-g0: 401 Unauthorized"), said
    assert "\n" not in said and "PRIVATE KEY" not in said


def test_configuration_problems_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no usable configuration") as missing:
        KubernetesProvider(KubernetesSettings(kubeconfig=tmp_path / "nowhere"))
    assert "\n" not in str(missing.value)
    with K8sContractServer() as k8s:
        kube = settings(k8s, tmp_path, context="elsewhere")
        with pytest.raises(ConfigError, match="Context 'elsewhere' not found"):
            KubernetesProvider(kube)
    with pytest.raises(ValidationError, match="kubectl is no longer used"):
        KubernetesSettings(kubectl="kubectl")  # type: ignore[call-arg]


def test_an_exceeded_quota_is_no_capacity() -> None:
    said = 'pods "fr-gpu-0-g0" is forbidden: exceeded quota: gpus, requested: nvidia.com/gpu=1'
    quota = ApiError(status=Status(code=403, reason="Forbidden", message=said))
    assert isinstance(api_error("apply Pod/fr-gpu-0-g0", quota), NoCapacityError)
    key = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7"
    other = ApiError(status=Status(code=422, reason="Invalid", message=f"data: {key}"))
    error = api_error("apply Secret/x", other)
    assert type(error) is ProviderError and key not in str(error)
