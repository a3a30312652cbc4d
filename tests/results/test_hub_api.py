"""The WebSocket results API on a real loopback socket: refusals (acceptance 2; issue 10:
401/403/429 before the upgrade), subscription filters, drop reporting, resume and token
expiry."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from framerelay.auth import KeySet
from framerelay.auth.keys import Key
from framerelay.errors import ConfigError
from framerelay.results import ResultRecord
from framerelay.schemas import SERVER_MESSAGE, ErrorMessage, ResultMessage, SubscribedMessage
from ingest.bus import ResultBus
from ingest.hub import HubConfig, ResultHub, build_hub
from ingest.settings import IngestSettings, ResultsSettings
from tests.conftest import TIMEOUT_FACTOR
from tests.support.auth import ed_keys, hs_keys, mint
from tests.support.results_hub import hub_guard, load_records, serving

pytestmark = pytest.mark.integration
OTHER_SECRET = "another-secret-that-is-long-enough"


@pytest.fixture(scope="module")
def records(real_results: Path) -> list[ResultRecord]:
    return load_records(real_results)


@asynccontextmanager
async def hub_with_feed(
    records: list[ResultRecord], secret: str, rate: float = 50.0, max_failures: int = 1000,
    **config: Any,
) -> AsyncIterator[tuple[str, ResultBus, ResultHub]]:  # fmt: skip
    """A hub (in this loop, real socket) and a task publishing ``records`` as cam-1."""
    bus = ResultBus()
    guard = hub_guard(secret, leeway_s=0, max_failures=max_failures)
    hub = ResultHub(bus, guard=guard, config=HubConfig(**config), registry=CollectorRegistry())
    settings = IngestSettings(api_port=0, results=ResultsSettings(ping_interval_s=0))

    async def feed() -> None:
        i = 0
        while rate > 0:
            bus.publish(records[i % len(records)].model_copy(update={"received_at": time.time()}))
            i += 1
            await asyncio.sleep(1 / rate)

    async with serving(hub, settings) as url:
        task = asyncio.create_task(feed())
        try:
            yield url, bus, hub
        finally:
            task.cancel()


def token(
    secret: str | KeySet, *scopes: str, ttl: float = 60, now: float | None = None,
    aud: str = "ingest",
) -> str:  # fmt: skip
    return mint(secret, scopes, aud, ttl, now=now, sub="app")


def forged(secret: str) -> str:
    """A token under the right key id but signed with another secret (a bad signature)."""
    kid = hs_keys(secret).kids[0]
    other = hs_keys(OTHER_SECRET).get(hs_keys(OTHER_SECRET).kids[0])
    assert other is not None
    return mint(KeySet([Key(kid, "HS256", other.jwk)]), ["results:cam-1"], "ingest")


def widened(secret: str) -> str:
    """A valid token whose claims were edited afterwards (scope widened)."""
    head, claims, sig = token(secret, "results:cam-2").split(".")
    raw = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    raw["scope"] = "results:*"
    edited = base64.urlsafe_b64encode(json.dumps(raw).encode()).rstrip(b"=").decode()
    return f"{head}.{edited}.{sig}"


def auth(tok: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"}


async def recv(ws: ClientConnection) -> Any:
    return SERVER_MESSAGE.validate_json(await asyncio.wait_for(ws.recv(), 10 * TIMEOUT_FACTOR))


def _client(url: str, query: str, headers: dict[str, str] | None = None) -> Any:
    return connect(f"{url}?{query}", additional_headers=headers or {}, proxy=None,
                   compression=None, open_timeout=10 * TIMEOUT_FACTOR)  # fmt: skip


REFUSALS = [
    # case, headers(secret) -> dict, query, HTTP status, error code
    ("no token", lambda s: {}, "stream=cam-1", 401, "unauthorized"),
    ("not bearer", lambda s: {"Authorization": "Basic abc"}, "stream=cam-1", 401, "unauthorized"),
    ("malformed", lambda s: auth("fr1.garbage"), "stream=cam-1", 401, "unauthorized"),
    ("old fr1 format", lambda s: auth("fr1.eyJzdWIiOiJhcHAifQ.c2ln"), "stream=cam-1", 401,
     "unauthorized"),
    ("unknown key", lambda s: auth(token(OTHER_SECRET, "results:cam-1")), "stream=cam-1",
     401, "unauthorized"),
    ("bad signature", lambda s: auth(forged(s)), "stream=cam-1", 401, "unauthorized"),
    ("claims edited", lambda s: auth(widened(s)), "stream=cam-1", 401, "unauthorized"),
    ("ed25519 not listed", lambda s: auth(token(ed_keys(), "results:*")), "stream=cam-1", 401,
     "unauthorized"),
    ("expired", lambda s: auth(token(s, "results:cam-1", ttl=60, now=time.time() - 3600)),
     "stream=cam-1", 401, "token_expired"),
    ("not yet valid", lambda s: auth(token(s, "results:cam-1", now=time.time() + 3600)),
     "stream=cam-1", 401, "unauthorized"),
    ("tunnel audience", lambda s: auth(token(s, "results:cam-1", aud="worker")), "stream=cam-1",
     401, "unauthorized"),
    ("orchestrator audience", lambda s: auth(token(s, "results:*", aud="orchestrator")),
     "stream=cam-1", 401, "unauthorized"),
    ("other stream", lambda s: auth(token(s, "results:cam-2")), "stream=cam-1", 403, "forbidden"),
    ("one of two", lambda s: auth(token(s, "results:cam-1")), "stream=cam-1&stream=cam-2",
     403, "forbidden"),
    ("all streams", lambda s: auth(token(s, "results:cam-1")), "", 403, "forbidden"),
    ("old stream scope", lambda s: auth(token(s, "stream:cam-1", "stream:*")), "stream=cam-1", 403,
     "forbidden"),
    ("worker scope", lambda s: auth(token(s, "worker:*")), "stream=cam-1", 403, "forbidden"),
    ("streams scope", lambda s: auth(token(s, "streams:read", "streams:write")), "stream=cam-1",
     403, "forbidden"),
    ("bad confidence", lambda s: auth(token(s, "results:cam-1")),
     "stream=cam-1&min_confidence=2", 400, "bad_request"),
    ("bad resume", lambda s: auth(token(s, "results:cam-1")), "stream=cam-1&resume=cam-1",
     400, "bad_request"),
    ("bad stream id", lambda s: auth(token(s, "results:*")), "stream=no%20spaces", 400,
     "bad_request"),
    ("unknown parameter", lambda s: auth(token(s, "results:cam-1")),
     "stream=cam-1&min_conf=0.5", 400, "bad_request"),
    ("resume id too big", lambda s: auth(token(s, "results:cam-1")),
     f"stream=cam-1&resume=cam-1@{2**64}-0", 400, "bad_request"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "headers", "query", "status", "code"), REFUSALS,
                         ids=[r[0] for r in REFUSALS])  # fmt: skip
async def test_refused_before_any_result(
    records: list[ResultRecord], secret: str, case: str, headers: Any, query: str, status: int,
    code: str,
) -> None:  # fmt: skip
    sent = headers(secret)
    async with hub_with_feed(records, secret) as (url, _, hub):
        with pytest.raises(InvalidStatus) as info:
            async with _client(url, query, sent):
                pass
        assert hub.metrics.sent._value.get() == 0  # nothing was ever sent
    exc = info.value
    assert exc.response.status_code == status
    body = ErrorMessage.model_validate_json(exc.response.body)
    assert (body.code, body.http_status) == (code, status)
    assert secret not in body.message
    assert all(v.split()[-1] not in body.message for v in sent.values())  # token never echoed
    if status in (401, 403):
        assert "Bearer" in exc.response.headers["www-authenticate"]


async def test_capacity_is_a_503(records: list[ResultRecord], secret: str) -> None:
    async with hub_with_feed(records, secret, max_subscribers=1) as (url, _, _):
        headers = auth(token(secret, "results:cam-1"))
        async with _client(url, "stream=cam-1", headers) as first:
            assert isinstance(await recv(first), SubscribedMessage)
            with pytest.raises(InvalidStatus) as info:
                async with _client(url, "stream=cam-1", headers):
                    pass
            status = info.value.response.status_code

    assert status == 503


async def test_subscribed_first_then_filtered_results(
    records: list[ResultRecord], secret: str
) -> None:
    async with hub_with_feed(records, secret) as (url, _, _):
        query = "stream=cam-1&class=person,bicycle&min_confidence=0.8"
        async with _client(url, query, auth(token(secret, "results:*"))) as ws:
            first = await recv(ws)
            got = [await recv(ws) for _ in range(40)]

    assert isinstance(first, SubscribedMessage)
    assert first.subscription.classes == ["person", "bicycle"]
    assert first.subscription.min_confidence == 0.8 and first.expires_at is not None
    assert all(isinstance(m, ResultMessage) and m.stream_id == "cam-1" for m in got)
    dets = [d for m in got for d in m.detections]
    assert dets and all(d.confidence >= 0.8 and d.class_name == "person" for d in dets)
    keys = [m.id for m in got if isinstance(m, ResultMessage) and m.id is not None]
    assert len(keys) == len(got) and keys == sorted(set(keys))


async def test_a_full_queue_drops_oldest_and_says_so(
    records: list[ResultRecord], secret: str
) -> None:
    async with hub_with_feed(records, secret, rate=0, queue_size=4) as (url, bus, _):
        async with _client(url, "stream=cam-1", auth(token(secret, "results:cam-1"))) as ws:
            assert isinstance(await recv(ws), SubscribedMessage)
            for r in records[:100]:  # a burst faster than any sender: the queue overflows
                bus.publish(r)
            bus.publish(records[100])  # (still queued behind the burst)
            msgs = [await recv(ws) for _ in range(5)]
            await asyncio.sleep(1.1)
            bus.publish(records[101])  # drops grew since the last notice: another one
            msgs += [await recv(ws)]

    results = [m for m in msgs if isinstance(m, ResultMessage)]
    assert [r.seq for r in results][:4] == [r.seq for r in records[97:101]]  # newest kept
    assert all(r.dropped == 97 for r in results)
    assert any(m.type == "notice" and m.code == "dropped" and m.dropped == 97 for m in msgs)


async def test_resume_replays_what_was_missed_without_duplicates(
    records: list[ResultRecord], secret: str
) -> None:
    async with hub_with_feed(records, secret, rate=0) as (url, bus, _):
        published = [bus.push(r) for r in records[:20]]
        query = f"stream=cam-1&resume=cam-1@{published[9].id}"
        async with _client(url, query, auth(token(secret, "results:cam-1"))) as ws:
            sub = await recv(ws)
            assert isinstance(sub, SubscribedMessage) and sub.replay == {"cam-1": 10}
            got: list[ResultMessage] = [await recv(ws) for _ in range(10)]
            bus.publish(records[20])
            got.append(await recv(ws))

    assert [m.seq for m in got] == [r.seq for r in records[10:21]]


async def test_token_expiring_mid_session_closes_with_4401(
    records: list[ResultRecord], secret: str
) -> None:
    async with hub_with_feed(records, secret, token_leeway_s=0) as (url, _, _):
        tok = token(secret, "results:cam-1", ttl=2)
        msgs: list[Any] = []
        async with _client(url, "stream=cam-1", auth(tok)) as ws:
            try:
                while True:
                    msgs.append(await recv(ws))
            except ConnectionClosed:
                pass
            code = ws.close_code

    assert code == 4401
    assert msgs[-1].type == "error" and msgs[-1].code == "token_expired"
    assert any(m.type == "result" for m in msgs)


async def test_failures_are_throttled_but_a_good_token_is_served(
    records: list[ResultRecord], secret: str
) -> None:
    async with hub_with_feed(records, secret, max_failures=3) as (url, _, hub):
        statuses = []
        bad = auth(token(OTHER_SECRET, "results:*"))
        for _ in range(3):
            with pytest.raises(InvalidStatus) as info:
                async with _client(url, "stream=cam-1", bad):
                    pass
            statuses.append(info.value.response.status_code)
        with pytest.raises(InvalidStatus) as info:  # a fourth failure: throttled
            async with _client(url, "stream=cam-1", bad):
                pass
        # a good token from the same address is served: others' failures never block it
        async with _client(url, "stream=cam-1", auth(token(secret, "results:cam-1"))) as ws:
            assert isinstance(await recv(ws), SubscribedMessage)
        exc = info.value

    assert statuses == [401, 401, 401]
    assert exc.response.status_code == 429
    assert 1 <= int(exc.response.headers["retry-after"]) <= 60
    body = ErrorMessage.model_validate_json(exc.response.body)
    assert body.code == "throttled" and "too many failed authentications" in body.message
    assert hub.metrics.refused.labels("throttled")._value.get() == 1


async def test_refusals_are_counted_by_reason(records: list[ResultRecord], secret: str) -> None:
    from prometheus_client import generate_latest

    registry = CollectorRegistry()
    settings = IngestSettings(
        token_secrets=secret, api_port=0, results=ResultsSettings(ping_interval_s=0)
    )
    hub = build_hub(ResultBus(), settings, registry)

    async with serving(hub, settings) as url:
        old = time.time() - 3600
        for headers in (
            {},
            auth(token(secret, "results:cam-2")),
            auth(token(secret, "results:cam-1", now=old)),
        ):
            with pytest.raises(InvalidStatus):
                async with _client(url, "stream=cam-1", headers):
                    pass

    text = generate_latest(registry).decode()
    for reason in ("missing", "scope", "expired"):
        assert f'framerelay_ingest_auth_refused_total{{reason="{reason}"}} 1.0' in text
    assert secret not in text


def test_without_keys_there_is_no_hub() -> None:
    """The hub used to be open when no secrets were set; now it refuses to exist."""
    with pytest.raises(ConfigError, match="no token keys"):
        build_hub(ResultBus(), IngestSettings(), CollectorRegistry())
