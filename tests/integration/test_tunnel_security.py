"""Acceptance (issue 10): the worker's attack matrix, TLS and mTLS.

A remote worker holds only the primary cloud's PUBLIC key set and its own
TLS certificate and key (as PEM text, the way a provider's env gives them).
Every endpoint that needs a token (``/v1/tunnel``, ``/info``, ``/metrics``
with ``metrics_auth``) refuses each attack with 401/403 before any upgrade
(0 tunnels accepted), with a reason, echoing neither the token nor a key;
the primary's tokens (old and new key while both are listed) work.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
import trustme
from cryptography.hazmat.primitives import serialization
from pydantic import SecretStr
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidMessage, InvalidStatus

from framerelay import wire
from framerelay.protocol.negotiation import offer
from gpu_worker.server import Worker
from tests.support.auth import b64url, ed_keys, hs256_by_hand, mint
from tests.support.worker_harness import running_worker, token

pytestmark = pytest.mark.integration
PRIMARY = ed_keys("primary-2026")
"""The primary cloud's private set (the ingest and orchestrator sign with it)."""
NEXT = ed_keys("primary-next")
"""Rotation: the next key, listed next to the old one."""
Attack = tuple[str | None, int, str]
"""Authorization header (None: none sent), expected status, a phrase of the reason."""


def _claims(scope: str) -> dict[str, object]:
    now = int(time.time())
    return {"iss": "framerelay", "sub": "mallory", "aud": "framerelay-worker", "scope": scope,
            "iat": now, "nbf": now, "exp": now + 60}  # fmt: skip


def _hmac_token(secret: bytes, kid: str, scope: str) -> str:
    """HS256 with what a worker holds (an attacker would try it; PyJWT would refuse)."""
    return hs256_by_hand(_claims(scope), secret, {"kid": kid, "typ": "JWT"})


def _unsigned(kid: str, scope: str) -> str:
    head = b64url(json.dumps({"alg": "none", "kid": kid}).encode())
    return f"{head}.{b64url(json.dumps(_claims(scope)).encode())}."


def _tampered(good: str, scope: str) -> str:
    head, _, sig = good.split(".")
    return f"{head}.{b64url(json.dumps(_claims(scope)).encode())}.{sig}"


def _swapped_signature(good: str, other: str) -> str:
    return good.rsplit(".", 1)[0] + "." + other.rsplit(".", 1)[1]


def attacks(scope: str, other_scope: str, tls_key_pem: bytes) -> dict[str, Attack]:
    """Every way in that must fail, for an endpoint needing ``scope``."""
    kid = PRIMARY.kids[0]
    good, now = mint(PRIMARY, scope, "worker"), time.time()
    public_jwk = next(iter(PRIMARY.public())).public_jwk()
    public_pem = (
        PRIMARY.signer()
        .verifying_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    impostor = mint(ed_keys(kid), scope, "worker")  # another key under the primary's kid
    b = "Bearer "
    return {
        "missing": (None, 401, "missing Authorization"),
        "not bearer": (f"Basic {good}", 401, "must be 'Bearer"),
        "malformed": (b + "not-a-token", 401, "malformed"),
        "bad signature": (b + _swapped_signature(good, impostor), 401, "signature does not match"),
        "tampered claims": (b + _tampered(good, "worker:*"), 401, "signature does not match"),
        "another key, same kid": (b + impostor, 401, "signature does not match"),
        "unknown kid": (b + mint(ed_keys("stranger"), scope, "worker"), 401, "unknown key id"),
        "expired": (b + mint(PRIMARY, scope, "worker", 10, now=now - 3600), 401, "expired"),
        "not yet valid": (b + mint(PRIMARY, scope, "worker", 60, now=now + 600), 401, "not valid"),
        "aud ingest": (b + mint(PRIMARY, scope, "ingest"), 401, "not for this service"),
        "aud orchestrator": (b + mint(PRIMARY, scope, "orchestrator"), 401, "not for this"),
        "wrong scope": (b + mint(PRIMARY, "worker:gpu-b", "worker"), 403, "does not grant"),
        "other scope": (b + mint(PRIMARY, [other_scope, "results:*"], "worker"), 403, "grant"),
        "alg none": (b + _unsigned(kid, scope), 401, "algorithm"),
        "HS256, public JWK as secret": (
            b + _hmac_token(json.dumps(public_jwk).encode(), kid, scope), 401, "algorithm"),
        "HS256, public PEM as secret": (b + _hmac_token(public_pem, kid, scope), 401, "algorithm"),
        "its TLS key, primary kid": (
            b + jwt.encode(_claims(scope), tls_key_pem, "ES256", {"kid": kid}), 401, "algorithm"),
        "its TLS key, own kid": (
            b + jwt.encode(_claims(scope), tls_key_pem, "ES256", {"kid": "pod"}), 401, "unknown"),
    }  # fmt: skip


@pytest.fixture(scope="module")
def pod_ca() -> trustme.CA:
    return trustme.CA(key_type=trustme.KeyType.ECDSA)


async def _tunnel(url: str, header: str | None, ctx: ssl.SSLContext) -> tuple[int, str]:
    headers = {"Authorization": header} if header is not None else {}
    try:
        async with connect(url, additional_headers=headers, ssl=ctx, compression=None,
                           proxy=None, open_timeout=10, subprotocols=offer()) as ws:  # fmt: skip
            hello, _ = wire.decode(await asyncio.wait_for(ws.recv(decode=False), 10))
            assert isinstance(hello, wire.Hello) and hello.worker_id == "gpu-a"
            return 101, ""
    except InvalidStatus as exc:
        return exc.response.status_code, exc.response.body.decode()


async def test_attack_matrix_on_a_worker_holding_only_the_public_set(pod_ca: trustme.CA) -> None:
    cert = pod_ca.issue_cert("127.0.0.1")
    tls_key = cert.private_key_pem.bytes()
    ctx = ssl.create_default_context()
    pod_ca.configure_trust(ctx)
    public = PRIMARY.public().merged(NEXT.public())
    chain = b"".join(c.bytes() for c in cert.cert_chain_pems).decode()
    tls: dict[str, Any] = {
        "tls_cert_pem": SecretStr(chain),
        "tls_key_pem": SecretStr(tls_key.decode()),
    }
    endpoints = {"/v1/tunnel": ("worker:gpu-a", "metrics:read"),
                 "/info": ("worker:gpu-a", "metrics:read"),
                 "/metrics": ("metrics:read", "worker:gpu-a")}  # fmt: skip

    async with running_worker(
        None, tunnel_keys=public.to_json(), metrics_auth=True, auth_max_failures=10_000, **tls
    ) as (worker, url):
        assert url.startswith("wss://")  # the PEM certificate is served
        base = url.replace("wss://", "https://").removesuffix("/v1/tunnel")
        async with httpx.AsyncClient(verify=ctx, base_url=base) as http:
            for path in ("/healthz", "/readyz"):
                assert (await http.get(path)).status_code == 200  # open

            async def probe(path: str, header: str | None) -> tuple[int, str]:
                if path == "/v1/tunnel":
                    return await _tunnel(url, header, ctx)
                headers = {"Authorization": header} if header is not None else {}
                resp = await http.get(path, headers=headers)
                return resp.status_code, resp.text

            refused = await _attack(worker, probe, endpoints, tls_key)
            assert worker.metrics.tunnels._value.get() == 0  # nothing was upgraded
            assert _refusals_counted(worker) == refused
            for keys in (PRIMARY, NEXT):  # both keys of the rotation
                for path, (scope, _) in endpoints.items():
                    status, _ = await probe(path, f"Bearer {mint(keys, scope, 'worker')}")
                    assert status == (101 if path == "/v1/tunnel" else 200), path
            assert worker.metrics.tunnels._value.get() == 2


async def _attack(
    worker: Worker,
    probe: Callable[[str, str | None], Awaitable[tuple[int, str]]],
    endpoints: dict[str, tuple[str, str]],
    tls_key: bytes,
) -> int:
    refused, wrong = 0, []
    for path, (scope, other) in endpoints.items():
        for name, (header, status, phrase) in attacks(scope, other, tls_key).items():
            got, body = await probe(path, header)
            if (got, phrase in body) != (status, True):
                wrong.append(f"{path} {name}: {got} {body.strip()!r}")
            assert tls_key.decode().splitlines()[1] not in body
            assert header is None or header.split()[-1] not in body  # never echoed
            refused += 1
    assert not wrong, "\n".join(wrong)
    assert worker.metrics.connections._value.get() == 0
    return refused


def _refusals_counted(worker: Worker) -> int:
    total = 0.0
    for metric in worker.metrics.auth_failures.collect():
        total += sum(s.value for s in metric.samples if s.name.endswith("_total"))
    return int(total)


@pytest.mark.parametrize(
    ("make_token", "status", "reason"),
    [
        (lambda s: None, 401, "missing Authorization"),
        (lambda s: "not-a-token", 401, "malformed"),
        (lambda s: token(s, ttl=10, now=time.time() - 3600), 401, "expired"),
        (lambda s: token("x" * 32), 401, "unknown key id"),
        (lambda s: token(s, scope="worker:gpu-b"), 403, "does not grant 'worker:gpu-a'"),
        (lambda s: mint(s, "worker:gpu-a", "ingest"), 401, "not for this service"),
        (lambda s: token(s, ttl=60, now=time.time() + 600), 401, "not valid yet"),
        (lambda s: mint(PRIMARY, "worker:gpu-a", "worker"), 401, "unknown key id"),
    ],
)  # fmt: skip
async def test_single_host_hs256_refusals(
    secret: str, make_token: Callable[[str], str | None], status: int, reason: str
) -> None:
    async with running_worker(secret) as (worker, url):
        tok = make_token(secret)
        headers = {"Authorization": f"Bearer {tok}"} if tok is not None else {}
        with pytest.raises(InvalidStatus) as err:
            async with connect(url, additional_headers=headers, proxy=None):
                pass
        assert err.value.response.status_code == status
        body = err.value.response.body.decode()
        assert reason in body and secret not in body
        assert worker.metrics.tunnels._value.get() == 0  # never upgraded


async def _open(url: str, tok: str | None, ssl_ctx: ssl.SSLContext | None = None) -> wire.Header:
    headers = {"Authorization": f"Bearer {tok}"} if tok is not None else {}
    async with connect(url, additional_headers=headers, ssl=ssl_ctx, compression=None, proxy=None,
                       open_timeout=10, subprotocols=offer()) as ws:  # fmt: skip
        header, _ = wire.decode(await asyncio.wait_for(ws.recv(decode=False), 10))
        return header


async def test_good_token_gets_hello_and_health_endpoints(secret: str) -> None:
    async with running_worker(secret) as (_, url):
        hello = await _open(url, token(secret))
        assert isinstance(hello, wire.Hello)
        assert hello.worker_id == "gpu-a" and hello.input_w == 416
        assert "CPUExecutionProvider" in hello.providers
        base = url.replace("ws://", "http://").removesuffix("/v1/tunnel")
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{base}/healthz")).status_code == 200
            assert (await http.get(f"{base}/readyz")).status_code == 200
            metrics = (await http.get(f"{base}/metrics")).text  # open by default
            assert "framerelay_worker_auth_failures" in metrics
            assert "framerelay_worker_tunnels_total 1.0" in metrics
            assert (await http.get(f"{base}/nope")).status_code == 404


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("ingest-a@example.test")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    server.private_key_and_cert_chain_pem.write_to_path(str(d / "server.pem"))
    client.private_key_and_cert_chain_pem.write_to_path(str(d / "client.pem"))
    return {k: d / f"{k}.pem" for k in ("ca", "server", "client")}


def _client_ctx(
    pki: dict[str, Path], with_ca: bool = True, with_cert: bool = False
) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki["ca"]) if with_ca else None)
    if with_cert:
        ctx.load_cert_chain(str(pki["client"]))
    return ctx


async def test_tls_round_trip_with_self_signed_ca(secret: str, pki: dict[str, Path]) -> None:
    async with running_worker(secret, tls_cert=pki["server"], tls_key=pki["server"]) as (_, url):
        assert url.startswith("wss://")
        assert isinstance(await _open(url, token(secret), _client_ctx(pki)), wire.Hello)
        with pytest.raises(ssl.SSLCertVerificationError):
            await _open(url, token(secret), _client_ctx(pki, with_ca=False))


async def test_mtls_requires_client_certificate(secret: str, pki: dict[str, Path]) -> None:
    tls: dict[str, Any] = {
        "tls_cert": pki["server"],
        "tls_key": pki["server"],
        "tls_client_ca": pki["ca"],
    }
    async with running_worker(secret, **tls) as (_, url):
        ok = await _open(url, token(secret), _client_ctx(pki, with_cert=True))
        assert isinstance(ok, wire.Hello)
        # With TLS 1.3 the server refuses the missing certificate after the
        # client's side of the handshake, so the client sees a dropped
        # connection instead of an alert: either way no upgrade happens.
        with pytest.raises((ssl.SSLError, InvalidMessage, ConnectionError, OSError)):
            await _open(url, token(secret), _client_ctx(pki))
