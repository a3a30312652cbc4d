"""Who holds what: each pod the fleet creates gets its own certificate from the
orchestrator's CA and only the public key set; the ingest-side check (the CA +
the pod's name as server_hostname) accepts its certificate and no other pod's.
Remote providers refuse plain ws:// and HS256-only keys by default.

RunPod pods go through the RunPod API v2 contract server (real HTTP); the local pod
is a real worker process whose canary runs over verified wss://."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from pydantic import SecretStr

from bench.rig.runpod_v2_contract import ContractServer, running_runpod_v2
from deploy.ca import PodCA
from deploy.health import StatusProber
from deploy.ingest_link import NullIngestLink
from deploy.models import PodRecord
from deploy.pod_trust import PodTrust
from deploy.providers.kubernetes.provider import KubernetesProvider
from deploy.providers.runpod.provider import RunPodProvider
from deploy.service import Orchestrator
from deploy.settings import KubernetesSettings, LocalSettings, RunPodSettings, TierConfig
from framerelay.auth import KeySet
from framerelay.errors import ConfigError
from tests.conftest import MODEL, TIMEOUT_FACTOR
from tests.support.auth import ed_keys
from tests.support.k8s_api import K8sContractServer
from tests.support.orchestrator import orch_settings
from tests.support.tls_handshake import handshake, sans, tls_server
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.integration
KEY = "rpa_" + "Tru5tT3stK3y" * 3
COMMUNITY = TierConfig(name="community", min_warm=2, max_workers=2, cloud_types=("COMMUNITY",))
POD_ENV = {
    "FRAMERELAY_WORKER_WORKER_ID", "FRAMERELAY_WORKER_HOST", "FRAMERELAY_WORKER_TUNNEL_KEYS",
    "FRAMERELAY_WORKER_TLS_CERT_PEM", "FRAMERELAY_WORKER_TLS_KEY_PEM",
}  # fmt: skip


def runpod(base: str, **over: Any) -> RunPodProvider:
    return RunPodProvider(
        RunPodSettings(api_key=SecretStr(KEY), base_url=base, backoff_s=0.01, **over)
    )


async def addressed(orch: Orchestrator) -> dict[str, PodRecord]:
    """The pods created, then passes until each has its address (a new pod is PROVISIONING,
    then STARTING, then RUNNING with its ports mapped)."""
    try:
        for _ in range(5):
            await orch.fleet.tick()
            pods = await orch.store.pods()
            if pods and all(p.tunnel_url for p in pods.values()):
                break
        return pods
    finally:
        await orch.store.clear()
        await orch.aclose()


def _private_values(keys: KeySet) -> list[str]:
    return [str(v) for k in keys for m, v in k.jwk.items() if m in ("d", "k")]


async def test_runpod_pods_get_own_certificates_and_only_the_public_keys(
    tmp_path: Path, secret: str
) -> None:
    keys = ed_keys()
    state = ContractServer(KEY)
    with running_runpod_v2(state) as base:
        settings = orch_settings(tmp_path, keys, provider="runpod", tiers=[COMMUNITY],
                                 token_secrets=SecretStr(secret))  # fmt: skip
        orch = Orchestrator(
            settings, provider=runpod(base), prober=StatusProber(20), ingest=NullIngestLink()
        )
        records = await addressed(orch)
    ca = PodCA.load_or_create(tmp_path / "ca")
    pods = {p.name: state.pod_view(p) for p in state.pods.values()}
    assert set(pods) == set(records) == {"fr-community-0-g0", "fr-community-1-g0"}
    serials = set()
    for name, pod in pods.items():
        env: dict[str, str] = pod["env"]
        assert set(env) == POD_ENV, sorted(env)
        text = json.dumps(env)
        assert secret not in text and "FRAMERELAY_SIGNING_KEYS" not in text
        assert not any(v in text for v in _private_values(keys))
        tunnel_keys = KeySet.from_json(env["FRAMERELAY_WORKER_TUNNEL_KEYS"])
        assert tunnel_keys.kids == keys.kids and not any(k.private for k in tunnel_keys)
        with pytest.raises(ConfigError, match="no signing key"):
            tunnel_keys.signer()  # what a pod holds cannot mint
        cert = x509.load_pem_x509_certificate(env["FRAMERELAY_WORKER_TLS_CERT_PEM"].encode())
        serials.add(cert.serial_number)
        assert sans(cert) == ([f"{name}.pods.framerelay"], [])
        assert ca.signed(cert)
        rec = records[name]
        assert rec.tls_server_name == f"{name}.pods.framerelay"
        assert rec.tunnel_url is not None and rec.tunnel_url.startswith("wss://")
        with tls_server(env["FRAMERELAY_WORKER_TLS_CERT_PEM"], env["FRAMERELAY_WORKER_TLS_KEY_PEM"],
                        tmp_path / name) as port:  # fmt: skip
            assert handshake(port, ca.cert_path, rec.tls_server_name).serial_number in serials
            other = next(n for n in pods if n != name)
            with pytest.raises(OSError, match="mismatch"):
                handshake(port, ca.cert_path, f"{other}.pods.framerelay")
    assert len(serials) == 2
    assert not state.key_in_url and state.client_errors == [] and state.violations == []


async def test_plain_ws_to_a_remote_provider_is_refused_by_default(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = ContractServer(KEY)
    with running_runpod_v2(state) as base:
        settings = orch_settings(tmp_path, provider="runpod", tiers=[COMMUNITY])
        insecure = runpod(base, tls=False)
        with pytest.raises(ConfigError, match=r"plain ws://.*ALLOW_INSECURE"):
            Orchestrator(settings, provider=insecure, prober=StatusProber(20))
        await insecure.aclose()
        caplog.set_level(logging.WARNING)
        allowed = runpod(base, tls=False, allow_insecure=True)
        orch = Orchestrator(settings, provider=allowed, prober=StatusProber(20),
                            ingest=NullIngestLink())  # fmt: skip
        records = await addressed(orch)
    assert "WITHOUT TLS" in caplog.text
    assert all(r.tunnel_url and r.tunnel_url.startswith("ws://") for r in records.values())
    assert all(r.tls_server_name is None for r in records.values())
    assert all("FRAMERELAY_WORKER_TLS_KEY_PEM" not in p.env for p in state.pods.values())
    assert not (tmp_path / "ca").exists()  # TLS off: no CA, no certificate


@pytest.mark.parametrize("provider", ["runpod", "kubernetes"])
async def test_remote_providers_refuse_hs256_only_keys(
    tmp_path: Path, secret: str, provider: str
) -> None:
    settings = orch_settings(tmp_path, signing_keys=None, token_secrets=secret, provider=provider)
    remote: Any = (
        runpod("http://127.0.0.1:9/v2")
        if provider == "runpod"
        else KubernetesProvider(KubernetesSettings(kubeconfig=kubeconfig(tmp_path)))
    )
    with pytest.raises(ConfigError, match="asymmetric signing keys"):
        Orchestrator(settings, provider=remote, prober=StatusProber(20))
    await remote.aclose()


def kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig of a contract API server (stopped: these tests never call it)."""
    with K8sContractServer() as k8s:
        return k8s.write_kubeconfig(tmp_path / "kubeconfig")


async def test_kubernetes_tls_off_needs_allow_insecure(tmp_path: Path) -> None:
    settings = orch_settings(tmp_path, provider="kubernetes")
    plain = KubernetesProvider(KubernetesSettings(kubeconfig=kubeconfig(tmp_path), tls=False))
    with pytest.raises(ConfigError, match="FRAMERELAY_ORCH_KUBERNETES__ALLOW_INSECURE"):
        Orchestrator(settings, provider=plain, prober=StatusProber(20))
    await plain.aclose()


def test_only_local_pods_with_only_shared_secrets_get_the_secret(
    tmp_path: Path, secret: str
) -> None:
    shared = KeySet.from_secrets([secret])
    hs = PodTrust(shared, shared_secrets=SecretStr(secret)).for_pod("fr-a-0-g0")
    assert hs.secret_env["FRAMERELAY_TOKEN_SECRETS"].get_secret_value() == secret
    assert "FRAMERELAY_WORKER_TUNNEL_KEYS" not in hs.env and hs.tls_server_name is None
    mixed = PodTrust(ed_keys().merged(shared), shared_secrets=SecretStr(secret))
    creds = mixed.for_pod("fr-a-0-g0")
    assert creds.secret_env == {} and set(creds.env) == {"FRAMERELAY_WORKER_TUNNEL_KEYS"}
    assert all(not k.symmetric for k in mixed.worker_keys)  # canaries sign as pods verify


def _process_given(pid: int) -> tuple[str, str]:
    """What a process was given: its command line and its environment."""
    proc = Path(f"/proc/{pid}")
    return (proc / "cmdline").read_bytes().decode(), (proc / "environ").read_bytes().decode()


@pytest.mark.parametrize("kind", ["ed25519", "shared secret"])
async def test_local_pod_serves_its_own_certificate_and_the_canary_verifies_it(
    tmp_path: Path, secret: str, kind: str
) -> None:
    """A real worker process: its canary (token on /info and the tunnel) runs over wss://
    verified with the CA and its name. With Ed25519 keys it holds only the public set."""
    tier = TierConfig(name="ondemand", min_warm=1, max_workers=1, capacity_fps=12)
    keys = ed_keys()
    auth: dict[str, Any] = (
        {"signing_keys": keys.to_json()} if kind == "ed25519"
        else {"signing_keys": None, "token_secrets": secret}
    )  # fmt: skip
    settings = orch_settings(
        tmp_path, tiers=[tier], local=LocalSettings(model=MODEL, threads=1, tls=True),
        canary_timeout_s=10 * TIMEOUT_FACTOR, startup_grace_s=300, **auth,
    )  # fmt: skip
    ca_file = tmp_path / "ca" / "ca.pem"
    seen: list[x509.Certificate] = []
    given: list[tuple[str, str]] = []

    orch = Orchestrator(settings, ingest=NullIngestLink())  # the real prober and canary
    try:
        last: list[PodRecord | None] = [None]

        async def ready() -> PodRecord | None:
            await orch.fleet.tick()
            last[0] = (await orch.store.pods()).get("fr-ondemand-0-g0")
            if last[0] is not None and last[0].ready:
                return last[0]
            failed = [p.failed for p in getattr(orch.provider, "pods", {}).values()]
            assert not any(failed), failed  # the worker could not start: say why now
            return None

        rec = await wait_until_async(
            ready, 120, lambda: f"fr-ondemand-0-g0 ready (last: {last[0]})", every_s=0.3
        )
        assert rec.tunnel_url is not None and rec.tls_server_name is not None
        port = int(rec.tunnel_url.rsplit(":", 1)[1].split("/")[0])
        seen.append(await asyncio.to_thread(handshake, port, ca_file, rec.tls_server_name))
        other = "fr-ondemand-1-g0.pods.framerelay"
        with pytest.raises(OSError, match="mismatch"):
            await asyncio.to_thread(handshake, port, ca_file, other)
        worker = getattr(orch.provider, "pods")["fr-ondemand-0-g0"].worker  # noqa: B009
        given.append(_process_given(worker.proc.pid))
    finally:
        await orch.store.clear()
        await orch.aclose()

    assert rec.tunnel_url is not None and rec.tunnel_url.startswith("wss://127.0.0.1:")
    assert rec.http_url is not None and rec.http_url.startswith("https://127.0.0.1:")
    assert rec.tls_server_name == "fr-ondemand-0-g0.pods.framerelay"
    (cert,) = seen
    assert sans(cert) == (["fr-ondemand-0-g0.pods.framerelay"], ["127.0.0.1"])
    assert PodCA.load_or_create(tmp_path / "ca").signed(cert)
    ((cmdline, environ),) = given
    assert "PRIVATE KEY" not in cmdline and secret not in cmdline and "--model" in cmdline
    text = cmdline + environ
    if kind == "ed25519":
        assert "FRAMERELAY_TOKEN_SECRETS" not in text and "FRAMERELAY_SIGNING_KEYS" not in text
        assert not any(d in text for d in _private_values(keys))
        assert "FRAMERELAY_WORKER_TUNNEL_KEYS=" in text
