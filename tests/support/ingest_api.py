"""A real ingest API on a loopback socket (uvicorn, as ``framerelay ingest`` serves it).

No worker: the default worker URL points at a free port nobody listens on, so
streams decode and report state while the tunnel keeps retrying.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, generate_latest

from framerelay.auth import KeySet
from ingest.app import create_app
from ingest.server import api_server
from ingest.service import IngestService
from ingest.settings import IngestSettings, ResultsSettings
from ingest.store import FileStore
from tests.support.auth import mint
from tests.support.servers import free_port
from tests.support.waiting import wait_until_async

ALL_SCOPES = ("streams:read", "streams:write", "routing:write", "results:*", "metrics:read")


@dataclass
class Ingest:
    service: IngestService
    registry: CollectorRegistry
    keys: KeySet | str
    base: str
    """``http(s)://127.0.0.1:<port>``"""
    store_path: Path

    @property
    def ws(self) -> str:
        return self.base.replace("http", "ws", 1) + "/v1/results"

    def token(self, *scopes: str, aud: str = "ingest", **kw: Any) -> str:
        return mint(self.keys, scopes or ALL_SCOPES, aud, **kw)

    def auth(self, *scopes: str, **kw: Any) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(*scopes, **kw)}"}

    def metrics(self) -> str:
        return generate_latest(self.registry).decode()

    def refused(self, reason: str) -> float:
        """``framerelay_ingest_auth_refused_total{reason}`` now."""
        value = self.registry.get_sample_value(
            "framerelay_ingest_auth_refused_total", {"reason": reason}
        )
        return value or 0.0


def settings_for(keys: KeySet | str, tmp_path: Path, **overrides: Any) -> IngestSettings:
    creds: dict[str, Any] = (
        {"token_secrets": keys} if isinstance(keys, str) else {"signing_keys": keys.to_json()}
    )
    values: dict[str, Any] = {
        "worker_url": f"ws://127.0.0.1:{free_port()}/v1/tunnel",
        "api_port": 0,
        "store_path": tmp_path / "streams.json",
        "results": ResultsSettings(ping_interval_s=0),
        "auth_max_failures": 10_000,
        "orchestrator_timeout_s": 10.0,  # an in-process orchestrator beside 3 busy workers
        **creds,
        **overrides,
    }
    return IngestSettings(**values)


@contextlib.asynccontextmanager
async def running_ingest(
    keys: KeySet | str, tmp_path: Path, **overrides: Any
) -> AsyncIterator[Ingest]:
    """The service and its API (``create_app`` + ``api_server``) in this event loop."""
    settings = settings_for(keys, tmp_path, **overrides)
    service = IngestService(settings, store=FileStore(settings.store_path))
    registry = CollectorRegistry()
    server, sock = api_server(create_app(service, registry=registry), settings)
    stop = asyncio.Event()
    run = asyncio.create_task(service.run(stop))
    serve = asyncio.create_task(server.serve(sockets=[sock]))
    scheme = "https" if settings.api_tls_cert is not None else "http"
    try:
        await wait_until_async(lambda: server.started and service.started.is_set(), 10, "ingest up")
        base = f"{scheme}://127.0.0.1:{sock.getsockname()[1]}"
        yield Ingest(service, registry, keys, base, settings.store_path)
    finally:
        server.should_exit = True
        stop.set()
        await asyncio.wait_for(asyncio.gather(serve, run, return_exceptions=True), 30)
        sock.close()


def client(ingest: Ingest, **kw: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=ingest.base, timeout=10, **kw)


@dataclass
class Pki:
    """A private CA (trustme) and PEM files: the API's server cert, a client cert (mTLS)."""

    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    """A CA that signed none of them (the wrong CA)."""


def make_pki(directory: Path, *hosts: str) -> Pki:
    import trustme

    directory.mkdir(parents=True, exist_ok=True)
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert(*(hosts or ("127.0.0.1", "localhost")))
    app = ca.issue_cert("app.clients.framerelay")
    files = Pki(*(directory / n for n in ("ca.pem", "cert.pem", "key.pem", "client.pem",
                                          "client.key", "other-ca.pem")))  # fmt: skip
    ca.cert_pem.write_to_path(str(files.ca))
    other.cert_pem.write_to_path(str(files.other_ca))
    files.cert.write_bytes(b"".join(b.bytes() for b in server.cert_chain_pems))
    server.private_key_pem.write_to_path(str(files.key))
    files.client_cert.write_bytes(b"".join(b.bytes() for b in app.cert_chain_pems))
    app.private_key_pem.write_to_path(str(files.client_key))
    return files
