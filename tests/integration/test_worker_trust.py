"""A worker holds only the public key set: what it accepts, what it refuses.

Acceptance (issue 10): a worker verifies EdDSA tunnel tokens minted by the
primary cloud's private set; tokens forged with anything a worker holds (the
public JWK as an HS256 secret, its own TLS key) are refused before the
upgrade; a private key set is refused at start; /info needs a token; failed
authentications are counted and throttled; the fault hook is a validated,
test-only setting.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import jwt
import pytest
import trustme
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from framerelay import wire
from framerelay.auth import KeySet
from framerelay.errors import ConfigError
from gpu_worker.settings import WorkerSettings
from tests.conftest import ROOT
from tests.integration.worker_harness import running_worker
from tests.support.auth import ed_keys, mint

pytestmark = pytest.mark.integration
SECRET = "unused-single-host-secret-" * 2


async def _status(url: str, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        async with connect(url, additional_headers=headers, compression=None, proxy=None,
                           open_timeout=10) as ws:  # fmt: skip
            header, _ = wire.decode(await asyncio.wait_for(ws.recv(decode=False), 10))
            assert isinstance(header, wire.Hello)
            return 101
    except InvalidStatus as exc:
        return exc.response.status_code


def _forged_hs256(public_jwk: dict[str, object], kid: str) -> str:
    now = int(time.time())
    claims = {"iss": "framerelay", "sub": "x", "aud": "framerelay-worker", "scope": "worker:*",
              "iat": now, "nbf": now, "exp": now + 60}  # fmt: skip
    import base64
    import hashlib
    import hmac

    def b64(data: bytes) -> bytes:
        return base64.urlsafe_b64encode(data).rstrip(b"=")

    head = b64(json.dumps({"alg": "HS256", "kid": kid}).encode())
    body = b64(json.dumps(claims).encode())
    secret = json.dumps(public_jwk).encode()
    sig = b64(hmac.new(secret, head + b"." + body, hashlib.sha256).digest())
    return (head + b"." + body + b"." + sig).decode()


def _signed_with_tls_key(key_pem: bytes, kid: str) -> str:
    now = int(time.time())
    claims = {"iss": "framerelay", "sub": "x", "aud": "framerelay-worker", "scope": "worker:*",
              "iat": now, "nbf": now, "exp": now + 60}  # fmt: skip
    return jwt.encode(claims, key_pem, algorithm="ES256", headers={"kid": kid})


def test_public_set_verifies_primary_tokens_and_refuses_forgeries() -> None:
    keys = ed_keys("primary-1")
    kid = keys.kids[0]
    ca = trustme.CA(key_type=trustme.KeyType.ECDSA)
    tls_key = ca.issue_cert("127.0.0.1").private_key_pem.bytes()
    public = keys.public()
    public_jwk = dict(next(iter(public)).public_jwk())

    async def main() -> dict[str, int]:
        async with running_worker(SECRET, tunnel_keys=public.to_json()) as (worker, url):
            got = {
                "primary": await _status(url, mint(keys, "worker:gpu-a", "worker")),
                "alg_confusion": await _status(url, _forged_hs256(public_jwk, kid)),
                "tls_key_same_kid": await _status(url, _signed_with_tls_key(tls_key, kid)),
                "tls_key_own_kid": await _status(url, _signed_with_tls_key(tls_key, "pod")),
                "other_private_set": await _status(url, mint(ed_keys(kid), "worker:*", "worker")),
                "for_the_ingest": await _status(url, mint(keys, "worker:gpu-a", "ingest")),
            }
            assert worker.metrics.connections._value.get() <= 1
            return got

    got = asyncio.run(main())
    assert got == {"primary": 101, "alg_confusion": 401, "tls_key_same_kid": 401,
                   "tls_key_own_kid": 401, "other_private_set": 401,
                   "for_the_ingest": 401}  # fmt: skip


def test_a_private_key_set_is_refused_at_start() -> None:
    from gpu_worker.server import Worker

    settings = WorkerSettings(port=0, worker_id="w", tunnel_keys=ed_keys().to_json())
    with pytest.raises(ConfigError, match="public"):
        Worker(settings, detector=None)  # refused before the model loads


def test_info_needs_a_token_and_failures_are_counted_and_throttled() -> None:
    async def main() -> None:
        async with running_worker(SECRET, auth_max_failures=3, metrics_auth=True) as (_, url):
            base = url.replace("ws://", "http://").removesuffix("/v1/tunnel")
            good = {"Authorization": f"Bearer {mint(SECRET, 'worker:gpu-a', 'worker')}"}
            metrics_tok = {"Authorization": f"Bearer {mint(SECRET, 'metrics:read', 'worker')}"}
            async with httpx.AsyncClient() as http:
                assert (await http.get(f"{base}/healthz")).status_code == 200
                assert (await http.get(f"{base}/readyz")).status_code == 200
                assert (await http.get(f"{base}/info")).status_code == 401
                assert (await http.get(f"{base}/info", headers=good)).json()["worker_id"] == "gpu-a"
                assert (await http.get(f"{base}/metrics", headers=good)).status_code == 403
                text = (await http.get(f"{base}/metrics", headers=metrics_tok)).text
                assert 'framerelay_worker_auth_failures_total{reason="missing"} 1.0' in text
                for _ in range(3):
                    await http.get(f"{base}/info", headers={"Authorization": "Bearer junk"})
                throttled = await http.get(f"{base}/info", headers=good)
                assert throttled.status_code == 429 and "Retry-After" in throttled.headers
                assert await _status(url, mint(SECRET, "worker:gpu-a", "worker")) == 429

    asyncio.run(main())


def test_fault_hook_is_a_test_only_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="TEST_HOOKS"):
        WorkerSettings(test_fault="hang_inference_after:1")
    assert WorkerSettings(test_fault="hang_inference_after:1", test_hooks=True).test_fault
    env = {"PATH": os.environ["PATH"], "FRAMERELAY_TOKEN_SECRETS": SECRET,
           "FRAMERELAY_WORKER_TEST_FAULT": "hang_inference_after:1",
           "FRAMERELAY_WORKER_PORT": "0"}  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "framerelay", "worker"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-500:]
    assert "TEST_HOOKS" in proc.stderr and "Traceback" not in proc.stderr


def test_the_old_fault_variable_arms_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The quoted bug: any FRAMERELAY_WORKER_FAULT in a pod's env armed the hook."""
    monkeypatch.setenv("FRAMERELAY_WORKER_FAULT", "hang_inference_after:0")

    async def main() -> None:
        async with running_worker(SECRET) as (worker, url):
            assert worker.settings.test_fault is None
            assert worker.batcher._faults.hang_after is None
            assert await _status(url, mint(SECRET, "worker:gpu-a", "worker")) == 101

    asyncio.run(main())


def test_key_set_file_variant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "workers.jwks"
    path.write_text(ed_keys().public().to_json())
    monkeypatch.setenv("FRAMERELAY_WORKER_TUNNEL_KEYS_FILE", str(path))
    settings = WorkerSettings()
    assert settings.tunnel_keys is not None
    assert len(KeySet.from_json(settings.tunnel_keys.get_secret_value())) == 1
