"""Issue 10: the ingest verifies a worker's certificate for the name the orchestrator gave
(``tls_server_name``, e.g. ``<pod>.pods.framerelay``) against its ``tls_ca``.

A stand-in worker (a TLS WebSocket server on 127.0.0.1 whose certificate names
only ``gpu-a.pods.framerelay``) answers HELLO. The pool connects when told
that name; told another name, or none (the URL's 127.0.0.1), the TLS handshake
fails and the tunnel token is never sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from websockets.asyncio.server import ServerConnection, serve

from framerelay import wire
from framerelay.auth import TokenVerifier
from framerelay.errors import ConfigError
from framerelay.protocol.negotiation import offer
from ingest.auth import tunnel_tokens
from ingest.registry import StreamRegistry, TunnelOptions, UnknownStream
from ingest.settings import IngestSettings, StreamConfig
from ingest.tunnel_client import client_ssl_context
from tests.support.auth import ed_keys, hs_keys
from tests.support.fixtures import media  # noqa: F401 - fixture
from tests.support.ingest_api import Pki, make_pki
from tests.support.media import Media
from tests.support.waiting import wait_until_async

SECRET = "a-single-host-secret-long-enough"
POD = "gpu-a.pods.framerelay"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), POD)


@contextlib.asynccontextmanager
async def fake_worker(pki: Pki, seen: list[str]) -> AsyncIterator[str]:
    """A TLS tunnel endpoint that records the Authorization header and says HELLO."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(pki.cert), str(pki.key))

    async def handler(ws: ServerConnection) -> None:
        assert ws.request is not None
        seen.append(ws.request.headers.get("Authorization", ""))
        hello = wire.Hello(worker_id="gpu-a", input_w=416, input_h=416, class_names=["person"],
                           providers=["fake"], max_inflight=2)  # fmt: skip
        await ws.send(wire.encode(hello))
        async for _ in ws:  # frames: never answered
            pass

    async with serve(
        handler, "127.0.0.1", 0, ssl=ctx, compression=None, subprotocols=offer()
    ) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"wss://127.0.0.1:{port}/v1/tunnel"


async def test_the_pool_verifies_the_worker_by_the_name_it_was_given(
    pki: Pki,
    media: Media,  # noqa: F811
    tmp_path: Path,
) -> None:
    settings = IngestSettings(token_secrets=SECRET, tls_ca=pki.ca)

    async def attempt(name: str | None) -> tuple[bool, str | None, list[str]]:
        seen: list[str] = []
        pool = StreamRegistry(tunnel_tokens(settings), lambda r: None,
                              ssl_context=client_ssl_context(str(pki.ca), None, None))  # fmt: skip
        try:
            async with fake_worker(pki, seen) as url:
                pool.create(StreamConfig(id="cam", url=str(media.short("mp4")),
                                         realtime=True, loop=True))  # fmt: skip
                await pool.place("cam", "gpu-a", url, name)
                client = pool.clients["gpu-a"]
                with contextlib.suppress(TimeoutError):
                    await wait_until_async(
                        lambda: client.connected.is_set() or bool(client.last_error),
                        10,
                        "connect or fail",
                    )
                await asyncio.sleep(0.2)
                return client.connected.is_set(), client.last_error, seen
        finally:
            await pool.aclose()

    ok, error, seen = await attempt(POD)
    assert ok and error is None and len(seen) == 1
    claims = TokenVerifier(hs_keys(SECRET), "worker").verify(seen[0].split()[1], "worker:gpu-a")
    assert claims.aud == "framerelay-worker"
    for wrong in ("gpu-b.pods.framerelay", None):
        ok, error, seen = await attempt(wrong)
        assert not ok and seen == []  # the token never reached an impostor
        assert error is not None and "CERTIFICATE_VERIFY_FAILED" in error, error


async def test_the_pool_refuses_plain_ws_to_another_host() -> None:
    pool = StreamRegistry(lambda w: "t", lambda r: None)

    with pytest.raises(ConfigError, match="refusing plain ws://"):
        await pool.place("cam", "w", "ws://gpu.example.com:8443/v1/tunnel")
    with pytest.raises(ConfigError, match="tls_server_name needs a wss://"):
        await pool.place("cam", "w", "ws://127.0.0.1:1/v1/tunnel", POD)
    for url in (
        "ws://127.0.0.1:1/v1/tunnel",
        "ws://[::1]:1/v1/tunnel",
        "ws://localhost:1/v1/tunnel",
        "ws://127.8.9.10:1/v1/tunnel",
    ):
        with pytest.raises(UnknownStream):  # loopback passes the check (no such stream)
            await pool.place("cam", "w", url)
    insecure = StreamRegistry(lambda w: "t", lambda r: None, TunnelOptions(allow_insecure=True))
    with pytest.raises(UnknownStream):
        await insecure.place("cam", "w", "ws://gpu.example.com:8443/v1/tunnel")


def test_settings_refuse_a_remote_plain_worker_url() -> None:
    from ingest.service import IngestService

    remote = "ws://gpu.example.com:8443/v1/tunnel"
    with pytest.raises(ConfigError, match="refusing plain ws://"):
        IngestService(IngestSettings(token_secrets=SECRET, worker_url=remote))
    IngestService(IngestSettings(token_secrets=SECRET, worker_url=remote,
                                 allow_insecure_workers=True))  # fmt: skip


def test_tunnel_credentials() -> None:
    with pytest.raises(ConfigError, match="no tunnel credentials"):
        tunnel_tokens(IngestSettings())
    assert tunnel_tokens(IngestSettings(token="fixed-token"))("any") == "fixed-token"
    keys = ed_keys()
    minted = tunnel_tokens(IngestSettings(signing_keys=keys.to_json()))("gpu-a")
    assert TokenVerifier(keys.public(), "worker").verify(minted, "worker:gpu-a").sub == "ingest"
    with pytest.raises(ConfigError, match="public keys"):  # a public set verifies, never mints
        tunnel_tokens(IngestSettings(signing_keys=keys.public().to_json()))


def test_signing_keys_come_from_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    keys = ed_keys("from-file")
    path = tmp_path / "keys.jwks"
    path.write_text(keys.to_json())
    monkeypatch.setenv("FRAMERELAY_SIGNING_KEYS_FILE", str(path))
    settings = IngestSettings()
    assert settings.signing_keys is not None and "from-file" in str(
        settings.signing_keys.get_secret_value()
    )
    assert keys.signer().jwk["d"] not in repr(settings)
    minted = tunnel_tokens(settings)("gpu-a")
    assert TokenVerifier(keys.public(), "worker").verify(minted, "worker:gpu-a").kid == "from-file"
