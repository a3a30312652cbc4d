"""Issue 28: failed-login throttles never lock out an authenticated client.

Before: behind one proxy, 20 bad tokens a minute blocked every client of the
ingest; on a worker, a hostile client sharing the ingest's address (NAT, same
host) made the worker answer 429 to the real ingest. Now the token is checked
first (a valid one always passes; only failures are throttled), failures are
counted per address as the server can trust it (the peer, or what a trusted
proxy forwarded), and a worker counts misbehaving tunnels per address and token
subject. Real ``framerelay worker`` / ``ingest`` / ``orchestrator`` processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from framerelay.launcher import LocalWorker
from framerelay.protocol.negotiation import offer
from tests.conftest import CLIP, MODEL, TIMEOUT_FACTOR
from tests.security.listener_rig import Api, api_process
from tests.security.procs import spawn, wait_healthy
from tests.support.auth import mint
from tests.support.servers import free_port
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.integration

MAX_FAILURES = 5
MAX_FAULTS = 2
WORKER_ID = "shared"
PROXY = "127.0.0.5"


@pytest.fixture(scope="module")
def worker_secret() -> str:
    return secrets.token_urlsafe(32)


@pytest.fixture(scope="module")
def worker(worker_secret: str) -> Iterator[LocalWorker]:
    env = {
        "FRAMERELAY_WORKER_AUTH_MAX_FAILURES": str(MAX_FAILURES),
        "FRAMERELAY_WORKER_MAX_TUNNEL_FAULTS": str(MAX_FAULTS),
    }
    args = ["--model", str(MODEL), "--threads", "1"]
    with LocalWorker(worker_secret, worker_id=WORKER_ID, args=args, env=env) as running:
        yield running


async def _upgrade(url: str, token: str) -> int:
    """A tunnel upgrade from 127.0.0.1 with ``token``: 101, or the HTTP refusal."""
    headers = {"Authorization": f"Bearer {token}"}
    try:
        async with connect(
            url,
            additional_headers=headers,
            proxy=None,
            compression=None,
            subprotocols=offer(),
            open_timeout=20 * TIMEOUT_FACTOR,
        ):
            return 101
    except InvalidStatus as exc:
        return exc.response.status_code


async def _misbehave(url: str, token: str) -> int:
    """A tunnel with a valid token that sends garbage (closed for a protocol error)."""
    headers = {"Authorization": f"Bearer {token}"}
    try:
        async with connect(
            url,
            additional_headers=headers,
            proxy=None,
            compression=None,
            subprotocols=offer(),
            open_timeout=20 * TIMEOUT_FACTOR,
        ) as ws:
            await ws.recv()  # the HELLO
            await ws.send(os.urandom(64))
            async with asyncio.timeout(20 * TIMEOUT_FACTOR):
                await ws.wait_closed()
            return 101
    except InvalidStatus as exc:
        return exc.response.status_code


def _tunnel_up(base: str) -> bool:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    return 'framerelay_ingest_tunnel_connected{worker="default"} 1.0' in text


async def test_a_neighbour_failing_at_the_worker_does_not_lock_the_ingest_out(
    worker: LocalWorker, worker_secret: str, tmp_path: Path
) -> None:
    url = worker.url
    valid = mint(worker_secret, f"worker:{WORKER_ID}", "worker", sub="neighbour")

    bad = [await _upgrade(url, "junk") for _ in range(MAX_FAILURES + 3)]
    faults = [await _misbehave(url, valid) for _ in range(MAX_FAULTS + 1)]
    # the same address, a valid token: served despite the failures above
    own = await _upgrade(url, mint(worker_secret, f"worker:{WORKER_ID}", "worker"))
    assert bad == [401] * MAX_FAILURES + [429] * 3
    assert faults == [101] * MAX_FAULTS + [429]  # the neighbour's own tunnels are refused
    assert own == 101
    port = free_port()  # now the real ingest, from the same address, mints its own token
    stream = {"id": "cam-1", "url": str(CLIP), "fps": 2}
    env = {
        "FRAMERELAY_TOKEN_SECRETS": worker_secret,
        "FRAMERELAY_INGEST_STORE_PATH": str(tmp_path / "streams.json"),
        "FRAMERELAY_INGEST_STREAMS": json.dumps([stream]),
    }
    ingest = spawn(
        "ingest", ["ingest", "--api-port", str(port), "--worker-url", url], env, tmp_path
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(ingest, base)
        await wait_until_async(
            lambda: _tunnel_up(base), 60, "the ingest's tunnel to the worker", every_s=0.2
        )
    finally:
        ingest.stop()
    assert not re.search(r"\b429\b", ingest.output())  # a status, not a port like :37429
    print(f"\nneighbour: bad tokens {bad}, misbehaving tunnels {faults}; ingest tunnel up")


def _token(api: Api) -> str:
    if api.kind == "ingest":
        return mint(api.secret, "streams:read", "ingest")
    return mint(api.secret, "fleet:read", "orchestrator")


@pytest.fixture(scope="module", params=["ingest", "orchestrator"])
def proxied(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Api]:
    """A service behind a trusted proxy (127.0.0.5), three failures per address."""
    kind = str(request.param)
    prefix = "FRAMERELAY_INGEST_" if kind == "ingest" else "FRAMERELAY_ORCH_"
    env = {f"{prefix}AUTH_MAX_FAILURES": "3", f"{prefix}LISTENER__TRUSTED_PROXIES": PROXY}
    with api_process(kind, tmp_path_factory.mktemp(kind), env) as running:
        yield running


def _get(api: Api, forwarded: str, token: str | None, source: str = PROXY) -> int:
    """GET a scoped route from ``source`` (by default the proxy) for ``forwarded``."""
    path = "/v1/streams" if api.kind == "ingest" else "/v1/pods"
    headers = {"X-Forwarded-For": forwarded}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(base_url=api.base, transport=transport, timeout=10) as http:
        return http.get(path, headers=headers).status_code


def test_behind_a_trusted_proxy_one_clients_failures_do_not_block_another(proxied: Api) -> None:
    good = _token(proxied)
    a = [_get(proxied, "198.51.100.7", "junk") for _ in range(5)]
    b_bad, b_good = _get(proxied, "198.51.100.8", "junk"), _get(proxied, "198.51.100.8", good)
    a_good = _get(proxied, "198.51.100.7", good)
    print(
        f"\n{proxied.kind}: client A's bad tokens {a}; client B bad/good {b_bad}/{b_good}; "
        f"A's good token {a_good}"
    )
    assert a == [401, 401, 401, 429, 429]
    assert (b_bad, b_good, a_good) == (401, 200, 200)


def test_an_untrusted_peer_cannot_choose_its_address(proxied: Api) -> None:
    """X-Forwarded-For from a peer that is no trusted proxy is ignored: a client rotating
    it is still counted as itself (127.0.0.1 too, which uvicorn alone would believe)."""
    statuses = [_get(proxied, f"203.0.113.{i}", "junk", source="127.0.0.1") for i in range(4)]
    assert statuses == [401, 401, 401, 429]
