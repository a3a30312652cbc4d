"""Network volumes (issue 17): a tier's volume reaches every provider's pods.

RunPod: ``mounts.network`` ``[{volumeId, path}]`` in the create body, only in the
volume's data centre (the API v2 contract server refuses another, as RunPod would).
Kubernetes: a PersistentVolumeClaim volume and its mount. Local: a shared directory.
Each pod's workers get their artefact cache on the volume, and the volume's mount
(``FRAMERELAY_WORKER_VOLUME_DIR``: they take from it only what its signed manifest lists,
issue 28). The local provider's pod-create -> ready is measured for a first pod (it
builds) and a second (cache hit, once the operator has signed the first one's build)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from bench.rig.runpod_v2_contract import ContractServer, running_runpod_v2
from deploy.models import PodSpec, PodStatus
from deploy.providers.base import ProviderError
from deploy.providers.kubernetes.render import render_pod
from deploy.providers.local import LocalProvider
from deploy.providers.runpod.provider import RunPodProvider
from deploy.settings import (
    KubernetesSettings,
    LocalSettings,
    OrchestratorSettings,
    RunPodSettings,
    TierConfig,
    TierVolume,
)
from framerelay.auth.manifest import MANIFEST_PATH, digest_tree, sign_manifest
from framerelay.launcher import LocalWorker
from tests.conftest import MODEL, TIMEOUT_FACTOR
from tests.support.auth import hs_keys
from tests.support.runpod import add_volume

KEY = "rpa_" + "V0lumeK3y" * 3
CACHE_ENV = "FRAMERELAY_WORKER_DETECTOR__CACHE_DIR"
VOLUME_ENV = "FRAMERELAY_WORKER_VOLUME_DIR"


def _settings(provider: str, volume: TierVolume, **extra: Any) -> OrchestratorSettings:
    tier = TierConfig(name="vol", volume=volume, **extra)
    return OrchestratorSettings(provider=provider, tiers=[tier])


def _sign(volume: Path, secret: str) -> None:
    """The operator signs the volume (``framerelay volume sign``; HS256 on one host)."""
    (volume / MANIFEST_PATH).parent.mkdir(parents=True, exist_ok=True)
    (volume / MANIFEST_PATH).write_text(sign_manifest(digest_tree(volume), hs_keys(secret)))


def _spec(name: str = "fr-vol-0-g0") -> PodSpec:
    return PodSpec(name=name, tier="vol", gpu_types=("NVIDIA L4",), spot=False)


def _check(server: ContractServer) -> None:
    assert server.violations == [] and server.client_errors == [] and not server.key_in_url


async def test_runpod_pod_mounts_the_tier_volume_in_its_data_centre() -> None:
    server = ContractServer(KEY)

    with running_runpod_v2(server) as url:
        volume = add_volume(url, KEY, "models", 50, "EU-SE-1")
        tv = TierVolume(runpod_id=volume["id"], data_center="EU-SE-1", mount_path="/runpod-volume")
        settings = _settings("runpod", tv, data_centers=("EU-RO-1", "EU-SE-1"))
        runpod = settings.runpod.model_copy(update={"api_key": SecretStr(KEY), "base_url": url})
        runpod.set_volumes({"vol": tv})
        provider = RunPodProvider(runpod)
        try:
            info = await provider.create(_spec())
        finally:
            await provider.aclose()
        pod = {**server.pod_view(server.pods[info.id]), "volume": volume["id"]}
    assert pod["mounts"] == {"network": [{"volumeId": pod["volume"], "path": "/runpod-volume"}]}
    assert pod["dataCenterId"] == "EU-SE-1"
    assert pod["env"][CACHE_ENV] == "/runpod-volume/framerelay/cache"
    assert pod["env"][VOLUME_ENV] == "/runpod-volume"
    _check(server)


async def test_runpod_asks_where_a_volume_is_when_the_tier_does_not_say() -> None:
    server = ContractServer(KEY)

    with running_runpod_v2(server) as url:
        volume = add_volume(url, KEY, "models", 50, "US-KS-2")
        settings = RunPodSettings(api_key=SecretStr(KEY), base_url=url, max_retries=0)
        provider = RunPodProvider(settings)
        try:
            settings.set_volumes({"vol": TierVolume(runpod_id=volume["id"])})
            info = await provider.create(_spec())
            settings.set_volumes({"vol": TierVolume(runpod_id="missing")})
            with pytest.raises(ProviderError, match="network volume missing") as err:
                await provider.create(_spec("fr-vol-1-g0"))
        finally:
            await provider.aclose()
        pod = server.pod_view(server.pods[info.id])
        error, volume_id = str(err.value), volume["id"]
    assert pod["dataCenterId"] == "US-KS-2"
    assert pod["mounts"]["network"][0]["volumeId"] == volume_id
    assert server.requests("GET", "/v2/network-volumes/{id}")
    assert "\n" not in error and KEY not in error
    assert error.startswith("RunPod could not find network volume missing: HTTP 404 Not Found")


async def test_runpod_refuses_a_volume_outside_the_pods_data_centres() -> None:
    server = ContractServer(KEY)

    with running_runpod_v2(server) as url:
        volume = add_volume(url, KEY, "models", 50, "EU-SE-1")
        settings = RunPodSettings(
            api_key=SecretStr(KEY), base_url=url, max_retries=0, network_volume_id=volume["id"]
        )
        provider = RunPodProvider(settings)
        spec = PodSpec(
            name="fr-x-0-g0",
            tier="x",
            gpu_types=("NVIDIA L4",),
            spot=False,
            data_centers=("EU-RO-1",),
        )
        try:
            with pytest.raises(ProviderError, match="is in EU-SE-1, not in its data_centers"):
                await provider.create(spec)
        finally:
            await provider.aclose()
    assert server.requests("POST", "/v2/pods") == []
    _check(server)


@pytest.mark.parametrize(
    ("provider", "volume", "extra", "message"),
    [
        ("runpod", TierVolume(runpod_id="v1", data_center="US-GA-1"),
         {"data_centers": ("EU-RO-1",)}, "is in US-GA-1"),
        ("runpod", TierVolume(claim="models"), {}, "needs runpod_id"),
        ("kubernetes", TierVolume(runpod_id="v1"), {}, "needs claim"),
        ("local", TierVolume(claim="models"), {}, "needs local_dir"),
    ],
)  # fmt: skip
def test_a_volume_the_provider_cannot_use_is_refused(
    provider: str, volume: TierVolume, extra: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        _settings(provider, volume, **extra)


def test_kubernetes_pod_mounts_the_tier_claim() -> None:
    settings = KubernetesSettings()
    settings.set_volumes({"vol": TierVolume(claim="framerelay-models", mount_path="/models")})
    pod = render_pod(_spec(), settings)["spec"]
    claim = {"name": "models", "persistentVolumeClaim": {"claimName": "framerelay-models"}}
    assert claim in pod["volumes"]
    container = pod["containers"][0]
    assert {"name": "models", "mountPath": "/models"} in container["volumeMounts"]
    assert {"name": CACHE_ENV, "value": "/models/framerelay/cache"} in container["env"]
    assert {"name": VOLUME_ENV, "value": "/models"} in container["env"]
    plain = render_pod(PodSpec(name="fr-a-0-g0", tier="a", gpu_types=("x",), spot=False), settings)
    assert "persistentVolumeClaim" not in str(plain)


@pytest.mark.integration
async def test_local_pods_share_the_volume_and_the_second_starts_from_the_cache(
    tmp_path: Path,
) -> None:
    volume = tmp_path / "volume"
    settings = LocalSettings(model=MODEL, threads=1, ready_timeout_s=120 * TIMEOUT_FACTOR)
    settings.set_volumes({"vol": TierVolume(local_dir=volume)})
    provider = LocalProvider(settings)

    secret_text = "network-volume-test-secret-0123456789"

    async def create_until_ready(name: str) -> float:
        started = time.perf_counter()
        secret = {"FRAMERELAY_TOKEN_SECRETS": SecretStr(secret_text)}
        spec = PodSpec(name=name, tier="vol", gpu_types=("x",), spot=False, secret_env=secret)
        await provider.create(spec)
        deadline = started + 120 * TIMEOUT_FACTOR
        while time.perf_counter() < deadline:
            info = await provider.get(name)
            assert info is not None and info.status is not PodStatus.EXITED
            if info.status is PodStatus.RUNNING:
                return time.perf_counter() - started
            await asyncio.sleep(0.05)
        raise AssertionError(f"{name} not ready")

    try:
        first_s = await create_until_ready("fr-vol-0-g0")
        await provider.terminate("fr-vol-0-g0")
        _sign(volume, secret_text)  # the operator vouches for the first pod's build
        second_s = await create_until_ready("fr-vol-1-g0")
    finally:
        await provider.aclose()

    logs = [provider.pods[n].worker.log_path.read_text() for n in ("fr-vol-0-g0", "fr-vol-1-g0")]
    print(f"\nlocal provider pod create -> ready: first {first_s:.2f} s (builds), "
          f"second {second_s:.2f} s (cache hit)")  # fmt: skip
    assert "built and stored in the artefact cache" in logs[0]
    assert "found in the artefact cache" in logs[1]
    assert any((volume / "framerelay" / "cache" / "models").rglob("meta.json"))


@pytest.mark.integration
async def test_runpod_contract_pods_on_one_volume_second_starts_from_the_cache(
    tmp_path: Path,
) -> None:
    """The API v2 contract server backs each pod with a real worker whose volume mount is
    a shared directory; pod create -> RUNNING (workers ready) is measured for both."""
    disk, mount = tmp_path / "volume", "/workspace"
    logs: list[Path] = []
    secret = "contract-volume-test-secret-0123"

    def launch(pod: dict[str, Any]) -> tuple[str, int, Any]:
        env = {
            k: v.replace(mount, str(disk), 1) if k.endswith("_DIR") else v
            for k, v in pod["env"].items()
        }
        assert env[VOLUME_ENV] == str(disk)
        env["FRAMERELAY_TOKEN_SECRETS"] = secret
        worker = LocalWorker(
            worker_id=pod["name"], env=env, args=["--model", str(MODEL), "--threads", "1"]
        )
        logs.append(worker.log_path)
        worker.start(120 * TIMEOUT_FACTOR)
        return "127.0.0.1", int(worker.url.rsplit(":", 1)[1].split("/")[0]), worker.stop

    server = ContractServer(KEY, launcher=launch)

    async def create_until_ready(provider: RunPodProvider, name: str) -> float:
        started = time.perf_counter()
        info = await provider.create(_spec(name))
        while time.perf_counter() - started < 120 * TIMEOUT_FACTOR:
            got = await provider.get(info.id)
            if got is not None and got.status is PodStatus.RUNNING:
                took = time.perf_counter() - started
                await provider.terminate(info.id)
                return took
            await asyncio.sleep(0.05)
        raise AssertionError(f"{name} not ready")

    with running_runpod_v2(server) as url:
        volume = add_volume(url, KEY, "models", 10, "EU-RO-1")
        tv = TierVolume(runpod_id=volume["id"], data_center="EU-RO-1", mount_path=mount)
        settings = RunPodSettings(
            api_key=SecretStr(KEY), base_url=url, tls=False, allow_insecure=True
        )
        settings.set_volumes({"vol": tv})
        provider = RunPodProvider(settings)
        try:
            first_s = await create_until_ready(provider, "fr-vol-0-g0")
            _sign(disk, secret)  # the operator vouches for the first pod's build
            second_s = await create_until_ready(provider, "fr-vol-1-g0")
        finally:
            await provider.aclose()
    print(
        f"\nRunPod API v2 contract server pod create -> ready (worker up): first "
        f"{first_s:.2f} s (builds), second {second_s:.2f} s (cache hit)"
    )
    assert "built and stored in the artefact cache" in logs[0].read_text()
    assert "found in the artefact cache" in logs[1].read_text()
    _check(server)
