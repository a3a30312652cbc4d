"""Issue 28's property: for random scope sets and random results requests, the streams
delivered are always a subset of what the scopes grant.

A real hub on a loopback socket (uvicorn in a thread of its own) holds three results of
each of four streams in its history; every request may name streams to receive and
streams to resume (from the start, so a resume replays everything held). After the
handshake one live result of every stream is published, then a last one on a stream
the subscription receives: the hub's queue keeps order, so once that last one arrives
everything the subscriber was going to get has arrived. Hypothesis draws the tokens'
scopes and the requests, and shrinks a counterexample to its smallest form.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from bench.rig.records import result_record
from ingest.bus import ResultBus
from ingest.hub import ResultHub
from ingest.settings import IngestSettings, ResultsSettings
from tests.conftest import TIMEOUT_FACTOR
from tests.support.auth import mint
from tests.support.results_hub import hub_guard, serving

pytestmark = pytest.mark.integration
SECRET = "a-property-test-secret-long-enough"
STREAMS = ("cam-1", "cam-2", "cam-3", "cam-4")
HELD = 3  # results of each stream in the hub's history
LAST_SEQ = itertools.count(10_000)
"""Each reading ends on a live result of its own seq (earlier ones stay in the history)."""


@dataclass
class Hub:
    url: str
    loop: asyncio.AbstractEventLoop
    bus: ResultBus

    def publish(self, stream: str, seq: int) -> None:
        """Publish one result from the hub's own loop (the bus is not thread-safe)."""
        done = asyncio.run_coroutine_threadsafe(self._publish(stream, seq), self.loop)
        done.result(10 * TIMEOUT_FACTOR)

    async def _publish(self, stream: str, seq: int) -> None:
        self.bus.publish(result_record(stream, seq, detections=1))


@pytest.fixture(scope="module")
def hub() -> Iterator[Hub]:
    loop = asyncio.new_event_loop()
    bus = ResultBus()
    for stream in STREAMS:
        for seq in range(HELD):
            bus.push(result_record(stream, seq, detections=1))
    started: asyncio.Future[str] = loop.create_future()
    stop = asyncio.Event()

    async def serve() -> None:
        guard = hub_guard(SECRET, max_failures=1_000_000)
        hub = ResultHub(bus, guard=guard, registry=CollectorRegistry())
        config = IngestSettings(api_port=0, results=ResultsSettings(ping_interval_s=0))
        async with serving(hub, config) as url:
            started.set_result(url)
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    url = asyncio.run_coroutine_threadsafe(asyncio.wait_for(started, 30), loop).result(60)
    try:
        yield Hub(url, loop, bus)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        with contextlib.suppress(RuntimeError):
            loop.close()


def _granted(scopes: set[str]) -> set[str]:
    return (
        set(STREAMS) if "results:*" in scopes else {s for s in STREAMS if f"results:{s}" in scopes}
    )


def _read(ws: ClientConnection, last: tuple[str, int]) -> list[str]:
    """Streams of every result up to the one ``last`` (stream, seq)."""
    got = []
    while True:
        message = json.loads(ws.recv(10 * TIMEOUT_FACTOR))
        if message["type"] != "result":
            continue
        got.append(message["stream_id"])
        if (message["stream_id"], message["seq"]) == last:
            return got


@dataclass
class Answer:
    status: int
    """101 when subscribed, else the refusal's HTTP status."""
    replay: dict[str, int]
    """What ``subscribed`` announced."""
    delivered: list[str]
    """The stream of every result received, replayed and live."""


def _subscribe(hub: Hub, token: str, streams: list[str], resume: list[str]) -> Answer:
    query = urlencode([("stream", s) for s in streams] + [("resume", f"{s}@0-0") for s in resume])
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with connect(
            f"{hub.url}?{query}",
            additional_headers=headers,
            proxy=None,
            compression=None,
            open_timeout=20 * TIMEOUT_FACTOR,
        ) as ws:
            first = json.loads(ws.recv(10 * TIMEOUT_FACTOR))
            assert first["type"] == "subscribed", first
            for stream in STREAMS:
                hub.publish(stream, HELD)
            last = (streams[0] if streams else STREAMS[0], next(LAST_SEQ))
            hub.publish(*last)
            return Answer(101, first["replay"], _read(ws, last))
    except InvalidStatus as exc:
        return Answer(exc.response.status_code, {}, [])


SCOPES = st.sets(st.sampled_from([f"results:{s}" for s in STREAMS] + ["results:*", "streams:read"]))
SOME_STREAMS = st.lists(st.sampled_from(STREAMS), unique=True, max_size=len(STREAMS))


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(scopes=SCOPES, streams=SOME_STREAMS, resume=SOME_STREAMS)
def test_delivered_streams_are_always_granted(
    hub: Hub, scopes: set[str], streams: list[str], resume: list[str]
) -> None:
    token = mint(SECRET, sorted(scopes) or ["streams:read"], "ingest", sub="prop")
    answer = _subscribe(hub, token, streams, resume)
    granted = _granted(scopes)
    wanted = set(streams) or set(STREAMS)
    named = set(streams) | set(resume) or set(STREAMS)
    assert set(answer.delivered) <= granted & wanted
    # the one rule, exactly: every stream named must be granted; a resumed one received
    if not named <= granted or (not streams and "results:*" not in scopes):
        assert (answer.status, answer.delivered) == (403, [])
    elif streams and not set(resume) <= set(streams):
        assert (answer.status, answer.delivered) == (400, [])
    else:
        assert answer.status == 101
        assert set(answer.replay) == set(resume)
        assert all(n >= HELD for n in answer.replay.values())
        expected = Counter(answer.replay) + Counter(wanted)
        expected[streams[0] if streams else STREAMS[0]] += 1  # the last one
        assert Counter(answer.delivered) == expected
