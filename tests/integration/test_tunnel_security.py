"""Acceptance: tokens are checked before the upgrade; TLS and mTLS work."""

from __future__ import annotations

import asyncio
import ssl
import time
from pathlib import Path

import httpx
import pytest
import trustme
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidMessage, InvalidStatus

from framerelay import wire
from tests.integration.worker_harness import running_worker, token
from tests.support.auth import mint

pytestmark = pytest.mark.integration


async def _open(url: str, tok: str | None, ssl_ctx: ssl.SSLContext | None = None) -> wire.Header:
    headers = {"Authorization": f"Bearer {tok}"} if tok is not None else {}
    async with connect(url, additional_headers=headers, ssl=ssl_ctx, compression=None, proxy=None,
                       open_timeout=10) as ws:  # fmt: skip
        header, _ = wire.decode(await asyncio.wait_for(ws.recv(decode=False), 10))
        return header


@pytest.mark.parametrize(
    ("make_token", "status", "reason"),
    [
        (lambda s: None, 401, "missing Authorization"),
        (lambda s: "not-a-token", 401, "malformed"),
        (lambda s: token(s, ttl=10, now=time.time() - 3600), 401, "expired"),
        (lambda s: token("x" * 32), 401, "unknown key id"),
        (lambda s: token(s, scope="worker:gpu-b"), 403, "does not grant 'worker:gpu-a'"),
        (lambda s: token(s, scope="results:*"), 403, "does not grant"),
        (lambda s: mint(s, "worker:gpu-a", "ingest"), 401, "not for this service"),
        (lambda s: token(s, ttl=60, now=time.time() + 600), 401, "not valid yet"),
    ],
)
def test_bad_tokens_rejected_before_upgrade(
    secret: str, make_token: object, status: int, reason: str
) -> None:
    async def main() -> None:
        async with running_worker(secret) as (worker, url):
            with pytest.raises(InvalidStatus) as err:
                await _open(url, make_token(secret))  # type: ignore[operator]
            assert err.value.response.status_code == status
            body = err.value.response.body.decode()
            assert reason in body
            assert secret not in body
            assert worker.metrics.connections._value.get() == 0  # never upgraded

    asyncio.run(main())


def test_good_token_gets_hello_and_health_endpoints(secret: str) -> None:
    async def main() -> None:
        async with running_worker(secret) as (_, url):
            hello = await _open(url, token(secret))
            assert isinstance(hello, wire.Hello)
            assert hello.worker_id == "gpu-a" and hello.input_w == 416
            assert "CPUExecutionProvider" in hello.providers
            base = url.replace("ws://", "http://").removesuffix("/v1/tunnel")
            async with httpx.AsyncClient() as http:
                assert (await http.get(f"{base}/healthz")).status_code == 200
                assert (await http.get(f"{base}/readyz")).status_code == 200
                metrics = (await http.get(f"{base}/metrics")).text
                assert "framerelay_worker_auth_failures" in metrics
                assert (await http.get(f"{base}/nope")).status_code == 404

    asyncio.run(main())


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


def test_tls_round_trip_with_self_signed_ca(secret: str, pki: dict[str, Path]) -> None:
    async def main() -> None:
        async with running_worker(secret, tls_cert=pki["server"], tls_key=pki["server"]) as (
            _,
            url,
        ):
            assert url.startswith("wss://")
            assert isinstance(await _open(url, token(secret), _client_ctx(pki)), wire.Hello)
            with pytest.raises(ssl.SSLCertVerificationError):
                await _open(url, token(secret), _client_ctx(pki, with_ca=False))

    asyncio.run(main())


def test_mtls_requires_client_certificate(secret: str, pki: dict[str, Path]) -> None:
    async def main() -> None:
        tls = {"tls_cert": pki["server"], "tls_key": pki["server"], "tls_client_ca": pki["ca"]}
        async with running_worker(secret, **tls) as (_, url):
            ok = await _open(url, token(secret), _client_ctx(pki, with_cert=True))
            assert isinstance(ok, wire.Hello)
            # With TLS 1.3 the server refuses the missing certificate after the
            # client's side of the handshake, so the client sees a dropped
            # connection instead of an alert: either way no upgrade happens.
            with pytest.raises((ssl.SSLError, InvalidMessage, ConnectionError, OSError)):
                await _open(url, token(secret), _client_ctx(pki))

    asyncio.run(main())
