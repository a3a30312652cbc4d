"""The orchestrator's calls out (real servers on 127.0.0.1): the heartbeat sends a
tunnel token on /info and verifies a TLS pod by its name; the ingest link
carries a cached ingest token, names the pod's certificate, and verifies an
https ingest with ingest_ca."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request

from deploy.ca import PodCA
from deploy.health import Canary, WorkerProber
from deploy.ingest_link import RENEW_BEFORE_S, HttpIngestLink, IngestToken
from deploy.models import StreamSpec
from deploy.tls import verify_context
from framerelay.auth import AUD_INGEST, AUD_WORKER, Claims, TokenIssuer, TokenVerifier
from tests.support.auth import ed_keys
from tests.support.orchestrator import serving

pytestmark = pytest.mark.integration
POD = "fr-a-0-g0"


def _tls(ca: PodCA, folder: Path, dns: list[str], ips: tuple[str, ...] = ()) -> dict[str, Any]:
    cert, key = ca.issue(dns[0], dns, ips)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "c.pem").write_text(cert)
    (folder / "k.pem").write_text(key)
    return {"ssl_certfile": str(folder / "c.pem"), "ssl_keyfile": str(folder / "k.pem")}


def fake_worker(verifier: TokenVerifier, seen: list[Claims]) -> FastAPI:
    app = FastAPI()

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/info")
    async def info(request: Request) -> dict[str, Any]:
        token = request.headers["authorization"].removeprefix("Bearer ")
        seen.append(verifier.verify(token, f"worker:{POD}"))
        return {"capacity_fps": 33.0}

    return app


async def test_heartbeat_sends_a_worker_token_and_verifies_the_pod_by_name(tmp_path: Path) -> None:
    keys = ed_keys()
    issuer = TokenIssuer(keys)
    ca = PodCA.load_or_create(tmp_path / "ca")
    seen: list[Claims] = []

    def token_for(name: str) -> str:
        return issuer.mint("orchestrator-canary", [f"worker:{name}"], 60, aud="worker")

    app = fake_worker(TokenVerifier(keys.public(), AUD_WORKER), seen)
    tls = _tls(ca, tmp_path / "pod", [f"{POD}.pods.framerelay"])  # no IP: the name must be used

    async def probe(ctx_ca: PodCA, name: str | None, url: str) -> Any:
        prober = WorkerProber(
            Canary(), token_for, ssl_context=verify_context(ctx_ca.cert_path, "pods")
        )
        try:
            return await prober.probe(POD, "wss://unused", url, canary=False, tls_name=name)
        finally:
            await prober.aclose()

    with serving(app, **tls) as url:
        good = await probe(ca, f"{POD}.pods.framerelay", url)
        wrong_name = await probe(ca, "fr-b-0-g0.pods.framerelay", url)
        stranger = PodCA.load_or_create(tmp_path / "stranger")
        wrong_ca = await probe(stranger, f"{POD}.pods.framerelay", url)
    assert good.alive and good.capacity_fps == 33.0, good
    assert len(seen) == 1 and seen[0].scope == (f"worker:{POD}",)
    for bad in (wrong_name, wrong_ca):
        assert not bad.alive and "TLS verification failed" in str(bad.error), bad


def fake_ingest(verifier: TokenVerifier, calls: list[dict[str, Any]]) -> FastAPI:
    app = FastAPI()

    @app.put("/v1/streams/{stream_id}/worker")
    async def put(stream_id: str, request: Request) -> dict[str, str]:
        token = request.headers["authorization"].removeprefix("Bearer ")
        claims = verifier.verify(token, "routing:write")
        calls.append({"token": token, "claims": claims, "body": await request.json()})
        return {"stream": stream_id}

    return app


async def test_ingest_link_token_tls_server_name_and_https(tmp_path: Path) -> None:
    keys = ed_keys()
    ca = PodCA.load_or_create(tmp_path / "ca")
    calls: list[dict[str, Any]] = []
    app = fake_ingest(TokenVerifier(keys.public(), AUD_INGEST), calls)
    spec = StreamSpec(id="cam-1", url="rtsp://cam/1")

    async def assign(url: str) -> list[bool]:
        link = HttpIngestLink(url, TokenIssuer(keys), ca=ca.cert_path)
        try:
            return [
                await link.assign(
                    spec, POD, "wss://127.0.0.1:1/v1/tunnel", f"{POD}.pods.framerelay"
                ),
                await link.assign(spec, POD, "ws://127.0.0.1:1/v1/tunnel"),
            ]
        finally:
            await link.aclose()

    with serving(app, **_tls(ca, tmp_path / "ingest", ["localhost"], ("127.0.0.1",))) as url:
        assert url.startswith("https://")
        assert await assign(url) == [True, True]
    first, second = calls
    assert first["body"]["tls_server_name"] == f"{POD}.pods.framerelay"
    assert "tls_server_name" not in second["body"]
    assert first["token"] == second["token"]  # cached
    assert set(first["claims"].scope) == {"routing:write", "streams:read"}
    assert first["claims"].aud == AUD_INGEST


def test_ingest_token_is_renewed_before_it_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    token = IngestToken(TokenIssuer(ed_keys()), ttl_s=600)
    first = token.get()
    assert token.get() == first
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + 600 - RENEW_BEFORE_S + 1)
    assert token.get() != first
