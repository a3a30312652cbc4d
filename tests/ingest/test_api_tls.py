"""Issue 10: the ingest API over HTTPS and the results WebSocket over WSS (mTLS optional),
served by ``api_server`` as ``framerelay ingest`` runs it; certificates from trustme."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError
from websockets.asyncio.client import connect

from framerelay.errors import ConfigError
from framerelay.schemas import SERVER_MESSAGE, SubscribedMessage
from ingest.server import api_server
from ingest.settings import IngestSettings
from tests.conftest import ROOT, service_env
from tests.support.ingest_api import Pki, client, make_pki, running_ingest

SECRET = "a-single-host-secret-long-enough"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _ctx(pki: Pki, *, ca: Path | None = None, with_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca or pki.ca))
    if with_cert:
        ctx.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    return ctx


async def test_https_api_and_wss_results(pki: Pki, tmp_path: Path) -> None:
    tls = {"api_tls_cert": pki.cert, "api_tls_key": pki.key}
    async with running_ingest(SECRET, tmp_path, **tls) as ingest:
        assert ingest.base.startswith("https://")
        async with client(ingest, verify=_ctx(pki)) as http:
            codes = [
                (await http.get("/healthz")).status_code,
                (await http.get("/v1/streams", headers=ingest.auth())).status_code,
                (await http.get("/v1/streams")).status_code,
            ]
        url = f"{ingest.ws}?stream=cam-1"
        assert url.startswith("wss://")
        async with connect(
            url, ssl=_ctx(pki), proxy=None, additional_headers=ingest.auth("results:cam-1")
        ) as ws:
            first = SERVER_MESSAGE.validate_json(await asyncio.wait_for(ws.recv(), 10))
        plain: type[Exception] | None = None
        try:  # plain HTTP to the TLS port gets nothing
            async with httpx.AsyncClient(timeout=5) as http:
                await http.get(ingest.base.replace("https", "http") + "/healthz")
        except httpx.HTTPError as exc:
            plain = type(exc)
    assert codes == [200, 200, 401]
    assert isinstance(first, SubscribedMessage)
    assert plain is not None


async def test_a_client_without_the_ca_is_refused(pki: Pki, tmp_path: Path) -> None:
    tls = {"api_tls_cert": pki.cert, "api_tls_key": pki.key}
    async with running_ingest(SECRET, tmp_path, **tls) as ingest:
        async with client(ingest, verify=_ctx(pki, ca=pki.other_ca)) as http:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await http.get("/healthz")


async def test_mtls_needs_a_client_certificate(pki: Pki, tmp_path: Path) -> None:
    tls = {"api_tls_cert": pki.cert, "api_tls_key": pki.key, "api_tls_client_ca": pki.ca}
    async with running_ingest(SECRET, tmp_path, **tls) as ingest:
        async with client(ingest, verify=_ctx(pki)) as http:
            with pytest.raises(httpx.HTTPError):
                await http.get("/healthz")
        async with client(ingest, verify=_ctx(pki, with_cert=True)) as http:
            health = (await http.get("/healthz")).status_code
            streams = (await http.get("/v1/streams", headers=ingest.auth())).status_code
        got = health, streams
    assert got == (200, 200)  # mTLS is on top of tokens, not instead


def test_tls_settings_are_checked_at_start(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="both api_tls_cert and api_tls_key"):
        IngestSettings(token_secrets=SECRET, api_tls_cert=pki.cert)
    with pytest.raises(ValidationError, match="needs api_tls_cert"):
        IngestSettings(token_secrets=SECRET, api_tls_client_ca=pki.ca)
    missing = IngestSettings(api_tls_cert=tmp_path / "nope.pem", api_tls_key=pki.key)
    with pytest.raises(ConfigError, match=r"FRAMERELAY_INGEST_API_TLS_CERT: .* not a readable"):
        api_server(object(), missing)
    swapped = IngestSettings(api_tls_cert=pki.key, api_tls_key=pki.cert)
    with pytest.raises(ConfigError, match="cannot load the API's TLS certificate"):
        api_server(object(), swapped)


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = service_env()
    return subprocess.run(
        [sys.executable, "-m", "framerelay", "ingest", "--api-port", "0", *args],
        env={**base, **env}, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_cli_errors_are_one_line(pki: Pki, tmp_path: Path) -> None:
    no_keys = _cli()
    bad_file = _cli("--api-tls-cert", str(tmp_path / "nope.pem"), "--api-tls-key", str(pki.key),
                    FRAMERELAY_TOKEN_SECRETS=SECRET)  # fmt: skip
    half = _cli("--api-tls-cert", str(pki.cert), FRAMERELAY_TOKEN_SECRETS=SECRET)
    remote = _cli("--worker-url", "ws://gpu.example.com:8443/v1/tunnel",
                  FRAMERELAY_TOKEN_SECRETS=SECRET)  # fmt: skip
    for run, says in ((no_keys, "no token keys"), (bad_file, "not a readable file"),
                      (half, "both api_tls_cert and api_tls_key"),
                      (remote, "refusing plain ws://")):  # fmt: skip
        assert run.returncode == 2, run.stderr
        assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
        assert run.stderr.startswith("framerelay: error: ") and says in run.stderr, run.stderr
        assert SECRET not in run.stderr
