"""What a worker holds and how it is started (issue 10).

A key set that can sign is refused at start; ``/info`` needs a token and
failed authentications are counted and throttled; a certificate given as PEM
text is served and its key is on disk only while ``ssl`` loads it; the fault
hook is a validated, test-only setting (the quoted bug: any
``FRAMERELAY_WORKER_FAULT`` in a pod's environment armed it).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trustme

from deploy.health import Canary
from framerelay.auth import KeySet
from framerelay.auth.keys import generate
from framerelay.errors import ConfigError
from framerelay.launcher import LocalWorker
from gpu_worker.settings import WorkerSettings
from gpu_worker.trust import pem_files
from tests.conftest import MODEL, ROOT, TIMEOUT_FACTOR
from tests.support.auth import ed_keys, mint
from tests.support.worker_harness import running_worker

pytestmark = pytest.mark.integration
SECRET = "unused-single-host-secret-" * 2


def _worker_cli(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "FRAMERELAY_WORKER_PORT": "0", **env}
    return subprocess.run([sys.executable, "-m", "framerelay", "worker"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


@pytest.mark.parametrize(
    "signing",
    [
        pytest.param(lambda: ed_keys(), id="private EdDSA set"),
        pytest.param(lambda: KeySet([generate("ES256")]), id="private ES256 set"),
        pytest.param(lambda: ed_keys().public().merged(KeySet([generate("HS256")])), id="oct key"),
    ],
)
def test_a_key_set_that_can_sign_is_refused_at_start(signing: object) -> None:
    keys: KeySet = signing()  # type: ignore[operator]
    proc = _worker_cli({"FRAMERELAY_WORKER_TUNNEL_KEYS": keys.to_json()})
    assert proc.returncode == 2, proc.stderr[-800:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "framerelay keys public" in lines[0], proc.stderr[-800:]
    for key in keys:  # no key material in the error
        for member in ("d", "k", "x"):
            if member in key.jwk:
                assert str(key.jwk[member]) not in proc.stderr


async def test_info_needs_a_token_and_failures_are_counted_and_throttled() -> None:
    async with running_worker(SECRET, auth_max_failures=3, metrics_auth=True) as (_, url):
        base = url.replace("ws://", "http://").removesuffix("/v1/tunnel")
        good = {"Authorization": f"Bearer {mint(SECRET, 'worker:gpu-a', 'worker')}"}
        metrics_tok = {"Authorization": f"Bearer {mint(SECRET, 'metrics:read', 'worker')}"}
        async with httpx.AsyncClient(base_url=base) as http:
            assert (await http.get("/healthz")).status_code == 200
            assert (await http.get("/readyz")).status_code == 200
            assert (await http.get("/info")).status_code == 401
            assert (await http.get("/info", headers=good)).json()["worker_id"] == "gpu-a"
            assert (await http.get("/metrics", headers=good)).status_code == 403
            text = (await http.get("/metrics", headers=metrics_tok)).text
            assert 'framerelay_worker_auth_failures_total{reason="missing"} 1.0' in text
            assert 'framerelay_worker_auth_failures_total{reason="scope"} 1.0' in text
            junk = {"Authorization": "Bearer junk"}
            for _ in range(3):
                await http.get("/info", headers=junk)
            throttled = await http.get("/info", headers=junk)
            assert throttled.status_code == 429 and "Retry-After" in throttled.headers
            tunnel = await http.get("/v1/tunnel", headers=junk)  # the same gate
            assert tunnel.status_code == 429
            # a valid token is never refused for the failures of others at its address
            assert (await http.get("/info", headers=good)).status_code == 200


def test_pem_files_are_private_and_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    with pem_files("CERT", "KEY") as (cert, key):
        assert stat.S_IMODE(cert.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        assert key.read_text() == "KEY" and cert.parent.parent == tmp_path
    assert not cert.parent.exists()


async def test_worker_serves_a_pem_certificate_from_its_env(tmp_path: Path) -> None:
    """As a provider starts a pod: public key set and certificate as env text."""
    ca = trustme.CA(key_type=trustme.KeyType.ECDSA)
    cert = ca.issue_cert("gpu-a.pods.framerelay", "127.0.0.1")
    key_pem = cert.private_key_pem.bytes().decode()
    keys = ed_keys()
    env = {
        "FRAMERELAY_WORKER_TUNNEL_KEYS": keys.public().to_json(),
        "FRAMERELAY_WORKER_TLS_CERT_PEM": b"".join(
            c.bytes() for c in cert.cert_chain_pems
        ).decode(),
        "FRAMERELAY_WORKER_TLS_KEY_PEM": key_pem,
        "TMPDIR": str(tmp_path),
    }  # fmt: skip
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    with LocalWorker(worker_id="gpu-a", args=["--model", str(MODEL)], env=env) as worker:
        assert worker.url.startswith("wss://"), worker.url
        assert worker.proc is not None
        proc_cmdline = Path(f"/proc/{worker.proc.pid}/cmdline")
        cmdline = (await asyncio.to_thread(proc_cmdline.read_bytes)).decode()
        persons, _ = await Canary(timeout_s=30 * TIMEOUT_FACTOR).run(
            worker.url,
            mint(keys, "worker:gpu-a", "worker"),
            ssl_context=ctx,
            server_hostname="gpu-a.pods.framerelay",
        )
        left = await asyncio.to_thread(lambda: list(tmp_path.glob("framerelay-tls-*")))
    assert persons >= 3
    assert left == []  # the key left the disk once loaded
    assert key_pem.splitlines()[1] not in cmdline


def test_fault_hook_is_a_test_only_setting() -> None:
    with pytest.raises(ConfigError, match="TEST_HOOKS"):
        WorkerSettings(test_fault="hang_inference_after:1")
    assert WorkerSettings(test_fault="hang_inference_after:1", test_hooks=True).test_fault
    proc = _worker_cli({"FRAMERELAY_TOKEN_SECRETS": SECRET,
                        "FRAMERELAY_WORKER_TEST_FAULT": "hang_inference_after:1"})  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-500:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "TEST_HOOKS" in lines[0], proc.stderr[-500:]


async def _canary(worker: LocalWorker, timeout_s: float) -> int:
    token = mint(SECRET, "worker:gpu-a", "worker")
    return (await Canary(timeout_s=timeout_s).run(worker.url, token))[0]


async def test_the_old_fault_variable_arms_nothing_in_a_worker_process() -> None:
    """The quoted bug: a stray FRAMERELAY_WORKER_FAULT in a pod's env hung inference."""
    env = {"FRAMERELAY_WORKER_FAULT": "hang_inference_after:0"}
    with LocalWorker(SECRET, worker_id="gpu-a", args=["--model", str(MODEL)], env=env) as worker:
        assert await _canary(worker, 30 * TIMEOUT_FACTOR) >= 3  # inference runs
    log = worker.log_path.read_text()
    assert "ignoring FRAMERELAY_WORKER_FAULT" in log and "TEST_FAULT" in log


async def test_the_hook_arms_only_with_the_test_switch() -> None:
    """The positive control of the test above: both variables set, inference hangs."""
    env = {"FRAMERELAY_WORKER_TEST_FAULT": "hang_inference_after:0",
           "FRAMERELAY_WORKER_TEST_HOOKS": "true"}  # fmt: skip
    worker = LocalWorker(SECRET, worker_id="gpu-a", args=["--model", str(MODEL)], env=env)
    with worker:
        try:
            with pytest.raises(TimeoutError):
                await _canary(worker, 3)
        finally:
            worker.kill()  # its inference thread never returns
    assert "TEST FAULT ARMED" in worker.log_path.read_text()


def test_key_set_file_variant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "workers.jwks"
    path.write_text(ed_keys().public().to_json())
    monkeypatch.setenv("FRAMERELAY_WORKER_TUNNEL_KEYS_FILE", str(path))
    settings = WorkerSettings()
    assert settings.tunnel_keys is not None
    assert len(KeySet.from_json(settings.tunnel_keys.get_secret_value())) == 1
