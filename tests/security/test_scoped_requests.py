"""Issue 28, holes 1 and 6, against a real ``framerelay ingest`` process on 127.0.0.1.

Hole 1: a token granting ``results:cam-1`` read cam-2's stored results by naming cam-2
in ``resume=`` (the hub checked ``stream=`` alone). cam-2 is not even a stream of this
ingest: its results lie in Redis only, as a removed stream's would. Now every stream a
results request names is checked against the token (``ingest.hub.required_scopes``),
and a resumed stream must be one the subscription receives.

Hole 6: ``worker_id: "*"`` in ``PUT /v1/streams/{id}/worker`` or ``POST /v1/rtt`` made
the ingest mint a ``worker:*`` tunnel token (accepted by every worker) and send it to a
URL the caller chose. Now a worker id is one worker's name or a 422, and the URL's
listener is never contacted.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis import Redis
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from bench.rig.records import result_record
from framerelay.auth import KeySet
from framerelay.results import ResultId
from tests.conftest import TIMEOUT_FACTOR
from tests.security.procs import Service, bearer, redis_prefix, spawn, wait_healthy
from tests.support.auth import ed_keys, mint
from tests.support.servers import CountingListener, counting_listener, free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
MANY = "1000000"  # failed authentications per window: 429 never hides an answer
STORED = 5  # cam-2's results in Redis


@dataclass
class Ingest:
    svc: Service
    keys: KeySet
    base: str

    def token(self, *scopes: str) -> str:
        return mint(self.keys, scopes, "ingest", sub="narrow-app")


def _seed(prefix: str, stream: str, count: int) -> None:
    """``count`` results of ``stream`` in Redis, as the ingest's publisher writes them."""
    redis = Redis()
    try:
        for seq in range(count):
            rid = ResultId(1_700_000_000_000 + seq)
            record = result_record(stream, seq).model_copy(update={"id": rid})
            redis.xadd(f"{prefix}:results:{stream}", {"r": record.model_dump_json()}, id=str(rid))
    finally:
        redis.close()


@pytest.fixture
def ingest(tmp_path: Path) -> Iterator[Ingest]:
    keys = ed_keys("scoped")
    keys_file = tmp_path / "signing.jwks"
    keys_file.write_text(keys.to_json())
    keys_file.chmod(0o600)
    with redis_prefix("scoped") as prefix:
        _seed(prefix.rstrip(":"), "cam-2", STORED)
        port = free_port()
        env = {
            "FRAMERELAY_SIGNING_KEYS_FILE": str(keys_file),
            "FRAMERELAY_INGEST_AUTH_MAX_FAILURES": MANY,
            "FRAMERELAY_INGEST_STORE_PATH": str(tmp_path / "streams.json"),
            "FRAMERELAY_REDIS_URL": "redis://127.0.0.1:6379/0",
            "FRAMERELAY_INGEST_RESULTS__REDIS_PREFIX": prefix.rstrip(":"),
            "FRAMERELAY_INGEST_STORE_KEY": f"{prefix}streams",
        }
        args = ["ingest", "--api-port", str(port), "--worker-url", "ws://127.0.0.1:9/v1/tunnel"]
        svc = spawn("ingest", args, env, tmp_path / "logs")
        try:
            wait_healthy(svc, f"http://127.0.0.1:{port}")
            yield Ingest(svc, keys, svc.url)
        finally:
            svc.stop()


@dataclass
class Answer:
    status: int
    """101 when subscribed, else the HTTP status of the refusal."""
    code: str = ""
    message: str = ""
    results: list[dict[str, Any]] | None = None


async def _subscribe(base: str, query: str, token: str) -> Answer:
    """Subscribe, and read the ``subscribed`` message and every replayed result."""
    url = f"{base.replace('http', 'ws', 1)}/v1/results?{query}"
    try:
        async with connect(
            url,
            additional_headers=bearer(token),
            proxy=None,
            compression=None,
            open_timeout=20 * TIMEOUT_FACTOR,
        ) as ws:
            first = json.loads(await asyncio.wait_for(ws.recv(), 10 * TIMEOUT_FACTOR))
            assert first["type"] == "subscribed", first
            results = []
            for _ in range(sum(first["replay"].values())):
                results.append(json.loads(await asyncio.wait_for(ws.recv(), 10 * TIMEOUT_FACTOR)))
            return Answer(101, results=results)
    except InvalidStatus as exc:
        body = json.loads(exc.response.body or b"{}")
        return Answer(exc.response.status_code, body.get("code", ""), body.get("message", ""))


async def test_the_stored_results_are_there_for_a_token_that_grants_them(ingest: Ingest) -> None:
    """The control: what the attack below would have read exists and is served."""
    answer = await _subscribe(
        ingest.base, "stream=cam-2&resume=cam-2@0-0", ingest.token("results:cam-2")
    )
    assert answer.status == 101
    assert answer.results is not None and len(answer.results) == STORED
    assert {r["stream_id"] for r in answer.results} == {"cam-2"}


ATTACKS = [
    # query, scopes of the token, HTTP status, code, the one-line reason says
    ("stream=cam-1&resume=cam-2@0-0", ("results:cam-1",), 403, "forbidden", "'results:cam-2'"),
    ("resume=cam-2@0-0", ("results:cam-1",), 403, "forbidden", "'results:*'"),
    (
        "stream=cam-1&resume=cam-1@0-0&resume=cam-2@0-0",
        ("results:cam-1",),
        403,
        "forbidden",
        "'results:cam-2'",
    ),
    (
        "stream=cam-1&resume=cam-2@0-0",
        ("results:cam-1", "results:cam-2"),
        400,
        "bad_request",
        "add stream=cam-2",
    ),
]


@pytest.mark.parametrize(
    ("query", "scopes", "status", "code", "says"), ATTACKS, ids=[a[0] for a in ATTACKS]
)
async def test_a_narrow_token_cannot_resume_another_stream(
    ingest: Ingest, query: str, scopes: tuple[str, ...], status: int, code: str, says: str
) -> None:
    answer = await _subscribe(ingest.base, query, ingest.token(*scopes))
    assert (answer.status, answer.code) == (status, code), answer
    assert says in answer.message and "\n" not in answer.message
    assert answer.results is None  # refused before the handshake: nothing delivered


@pytest.fixture
def listener() -> Iterator[CountingListener]:
    with counting_listener() as found:
        yield found


BAD_WORKER_IDS = ["*", "gpu-*", "worker:*", "a b", "", "-gpu", "x" * 129]


def test_no_request_mints_a_wildcard_tunnel_token(
    ingest: Ingest, listener: CountingListener
) -> None:
    write = bearer(ingest.token("streams:write", "streams:read"))
    routing = bearer(ingest.token("routing:write", "streams:read"))
    tunnel = f"ws://127.0.0.1:{listener.port}/v1/tunnel"
    with httpx.Client(base_url=ingest.base, timeout=20 * TIMEOUT_FACTOR) as http:
        made = http.post(
            "/v1/streams", headers=write, json={"id": "x", "url": "rtsp://127.0.0.1:1/x"}
        )
        assert made.status_code == 201, made.text
        for worker_id in BAD_WORKER_IDS:
            for method, path, body in (
                ("PUT", "/v1/streams/x/worker", {"worker_id": worker_id, "url": tunnel}),
                ("POST", "/v1/rtt", {"worker_id": worker_id, "url": tunnel, "pings": 1}),
            ):
                resp = http.request(method, path, headers=routing, json=body)
                assert resp.status_code == 422, (worker_id, path, resp.text)
                (error,) = resp.json()["detail"]
                assert error["loc"][-1] == "worker_id" and "\n" not in error["msg"]
        assert http.get("/v1/routing", headers=routing).json().get("x") != "*"
        assert listener.connections == 0, "a refused placement still reached its URL"
        # the control: one worker's name is placed, and the ingest does dial the URL
        moved = http.put(
            "/v1/streams/x/worker", headers=routing, json={"worker_id": "gpu-a", "url": tunnel}
        )
        assert moved.status_code == 200, moved.text
    wait_until(
        lambda: listener.connections > 0, 30, "the ingest dialled gpu-a's tunnel URL", every_s=0.2
    )
