"""Issue 11: request bodies are capped in every API (``framerelay.web_limits.BodyLimit``).

Real uvicorn servers on 127.0.0.1 and a raw HTTP client: a Content-Length over
the limit is a 413 before a byte of the body is sent (and before the token is
checked); a chunked body is a 413 once it passes the limit (after the token
passed: an unauthenticated one is a 401); bodies up to the limit work; the
connection stays usable after a 413. Then the pure ASGI contract, and the
figure the issue quotes: 6 MB bodies no longer grow a real ingest process.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.api import create_app as orch_app
from deploy.health import StatusProber
from deploy.ingest_link import NullIngestLink
from deploy.service import Orchestrator
from framerelay.web_limits import DEFAULT_MAX_BODY_BYTES, BodyLimit, BodyTooLarge
from ingest.settings import IngestSettings
from tests.conftest import CLIP, ROOT, TIMEOUT_FACTOR, service_env
from tests.support.auth import ed_keys, mint
from tests.support.ingest_api import running_ingest
from tests.support.orchestrator import orch_settings, serving_here
from tests.support.raw_http import Answer, Connection, chunked, connection, head, plain
from tests.support.servers import free_port

MiB = 1 << 20


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def _stream_json(sid: str, size: int) -> bytes:
    """A valid stream definition padded with whitespace to exactly ``size`` bytes."""
    doc = json.dumps({"id": sid, "url": str(CLIP), "fps": 1}).encode()
    return doc + b" " * (size - len(doc))


def _refusal(answer: Answer, limit: int, setting: str) -> None:
    assert answer.status == 413, answer
    body = answer.json()
    assert body["limit_bytes"] == limit
    assert str(limit) in body["detail"] and setting in body["detail"]


# -- the ingest API -----------------------------------------------------------------


async def test_ingest_content_length_over_the_limit_is_413_before_the_body(tmp_path: Path) -> None:
    async with running_ingest("s" * 32, tmp_path) as ingest:
        port, answers = _port(ingest.base), []
        for token in (None, ingest.token()):  # 413 first, whoever asks
            async with connection(port) as conn:
                await conn.send(
                    [head("POST", "/v1/streams", token=token, length=DEFAULT_MAX_BODY_BYTES + 1)]
                )
                answers.append(await conn.answer(5))  # no body sent yet
                # the rest of the body is discarded; the connection still serves
                await conn.send(plain(b"x" * (DEFAULT_MAX_BODY_BYTES + 1)))
                again = await conn.exchange(head("GET", "/healthz"))
        answers, again, streams = answers, again, len(ingest.service.streams)
    for answer in answers:
        _refusal(answer, DEFAULT_MAX_BODY_BYTES, "FRAMERELAY_INGEST_MAX_BODY_BYTES")
    assert again.status == 200 and streams == 0
    print(f"\nContent-Length {DEFAULT_MAX_BODY_BYTES + 1}: {[a.status for a in answers]} "
          f"before the body; same connection afterwards: {again.status}")  # fmt: skip


async def test_ingest_chunked_body_over_the_limit(tmp_path: Path) -> None:
    big = _stream_json("cam-big", 3 * MiB)

    async with running_ingest("s" * 32, tmp_path) as ingest:
        port = _port(ingest.base)
        async with connection(port) as conn:
            ok = await conn.exchange(
                head("POST", "/v1/streams", token=ingest.token(), chunked=True), chunked(big)
            )
            sent = conn.sent
        async with connection(port) as conn:  # unauthenticated: the token comes first
            anon = await conn.exchange(head("POST", "/v1/streams", chunked=True), chunked(big))
        over, anon, sent, streams = ok, anon, sent, len(ingest.service.streams)
    _refusal(over, DEFAULT_MAX_BODY_BYTES, "FRAMERELAY_INGEST_MAX_BODY_BYTES")
    assert anon.status == 401, anon
    assert streams == 0
    print(f"\nchunked {len(big)} B: authenticated {over.status}, anonymous {anon.status}; "
          f"client wrote {sent} B")  # fmt: skip


async def test_ingest_bodies_up_to_the_limit_work(tmp_path: Path) -> None:
    async with running_ingest("s" * 32, tmp_path) as ingest:
        token, port = ingest.token(), _port(ingest.base)
        statuses = []
        async with connection(port) as conn:
            exact = _stream_json("cam-exact", DEFAULT_MAX_BODY_BYTES)
            answer = await conn.exchange(
                head("POST", "/v1/streams", token=token, length=len(exact)), plain(exact)
            )
            statuses.append(answer.status)
            small = _stream_json("cam-chunked", 4096)
            answer = await conn.exchange(
                head("POST", "/v1/streams", token=token, chunked=True), chunked(small, 1000)
            )
            statuses.append(answer.status)
        async with httpx.AsyncClient(base_url=ingest.base, timeout=10) as http:
            r = await http.delete("/v1/streams/cam-exact", headers=ingest.auth())
            statuses.append(r.status_code)
    assert statuses == [201, 201, 204]


async def test_the_limit_is_a_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAMERELAY_INGEST_MAX_BODY_BYTES", "2048")
    assert IngestSettings().max_body_bytes == 2048
    monkeypatch.setenv("FRAMERELAY_ORCH_MAX_BODY_BYTES", "4096")
    assert orch_settings(tmp_path).max_body_bytes == 4096
    monkeypatch.delenv("FRAMERELAY_INGEST_MAX_BODY_BYTES")
    assert IngestSettings().max_body_bytes == DEFAULT_MAX_BODY_BYTES == 1_048_576

    async with running_ingest("s" * 32, tmp_path, max_body_bytes=100) as ingest:
        async with connection(_port(ingest.base)) as conn:
            over = await conn.exchange(head("POST", "/v1/streams", length=101), [b"x" * 101])
            fine = await conn.exchange(
                head("POST", "/v1/streams", token=ingest.token(), length=100), [b"{" * 100]
            )
    _refusal(over, 100, "FRAMERELAY_INGEST_MAX_BODY_BYTES")
    assert fine.status == 422  # read and parsed: the limit allowed it


# -- the orchestrator API -----------------------------------------------------------


@asynccontextmanager
async def orchestrator(tmp_path: Path, **over: Any) -> AsyncIterator[tuple[Orchestrator, int]]:
    orch = Orchestrator(orch_settings(tmp_path, ed_keys(), **over), prober=StatusProber(20),
                        ingest=NullIngestLink())  # fmt: skip
    try:
        async with serving_here(orch_app(orch)) as url:
            yield orch, _port(url)
    finally:
        await orch.store.clear()
        await orch.aclose()


@pytest.mark.integration
async def test_orchestrator_bodies_are_capped(tmp_path: Path) -> None:
    limit = 4096
    setting = "FRAMERELAY_ORCH_MAX_BODY_BYTES"

    async with orchestrator(tmp_path, max_body_bytes=limit) as (orch, port):
        token = mint(orch.keys, ["fleet:read", "fleet:write"], "orchestrator")
        refused = []
        async with connection(port) as conn:
            refused.append(
                await conn.exchange(
                    head("POST", "/v1/streams", length=limit + 1), plain(b"x" * (limit + 1))
                )
            )
            big = json.dumps({"id": "cam-1", "url": "x" * limit}).encode()
            refused.append(
                await conn.exchange(
                    head("POST", "/v1/streams", token=token, chunked=True), chunked(big, 1024)
                )
            )
            anon = await conn.exchange(
                head("POST", "/v1/streams", chunked=True), chunked(big, 1024)
            )
            body = json.dumps({"id": "cam-2", "url": "rtsp://cam/2", "fps": 2}).encode()
            ok = await conn.exchange(
                head("POST", "/v1/streams", token=token, length=len(body)), [body]
            )
        refused, anon, ok, streams = refused, anon, ok, len(await orch.store.streams())
    for answer in refused:
        _refusal(answer, limit, setting)
    assert anon.status == 401 and ok.status == 201, (anon, ok)
    assert streams == 1


# -- the ASGI contract --------------------------------------------------------------


async def _drive(app: Any, scope: dict[str, Any], messages: list[dict[str, Any]]) -> list[Any]:
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def _reader(seen: list[Any]) -> Any:
    """An application that reads the whole body, then answers 200 (or 400 on an error)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        try:
            while (message := await receive())["more_body"]:
                seen.append(len(message["body"]))
        except BodyTooLarge as exc:
            seen.append(exc)
            status = 400
        else:
            status = 200
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"app"})

    return app


def _http(length: int | None = None) -> dict[str, Any]:
    headers = [(b"content-length", str(length).encode())] if length is not None else []
    return {"type": "http", "headers": headers}


def _body(*sizes: int) -> list[dict[str, Any]]:
    return [{"type": "http.request", "body": b"x" * n, "more_body": True} for n in sizes] + [
        {"type": "http.request", "body": b"", "more_body": False}
    ]


async def test_asgi_content_length_over_never_calls_the_app() -> None:
    seen: list[Any] = []
    sent = await _drive(BodyLimit(_reader(seen), 10), _http(11), _body(11))
    assert seen == [] and sent[0]["status"] == 413
    assert json.loads(sent[1]["body"])["limit_bytes"] == 10


async def test_asgi_counted_body_over_replaces_the_apps_answer() -> None:
    seen: list[Any] = []
    sent = await _drive(BodyLimit(_reader(seen), 10), _http(), _body(6, 4, 1))
    assert seen[:2] == [6, 4] and isinstance(seen[2], BodyTooLarge)
    assert [m.get("status") for m in sent] == [413, None]
    assert b"app" not in sent[1]["body"]


async def test_asgi_at_the_limit_and_other_scopes_pass() -> None:
    seen: list[Any] = []
    sent = await _drive(BodyLimit(_reader(seen), 10), _http(10), _body(6, 4))
    assert seen == [6, 4] and sent[0]["status"] == 200
    ws: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        ws.append(scope["type"])

    await _drive(BodyLimit(app, 0), {"type": "websocket", "headers": []}, [])
    assert ws == ["websocket"]


async def test_asgi_a_started_answer_is_not_replaced() -> None:
    async def streaming(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        while (await receive())["more_body"]:
            pass

    with pytest.raises(BodyTooLarge):
        await _drive(BodyLimit(streaming, 10), _http(), _body(11))


# -- memory of a real ingest process --------------------------------------------------


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


def _start_ingest(tmp_path: Path, secret: str) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    env = service_env()
    env |= {"FRAMERELAY_TOKEN_SECRETS": secret,
            "FRAMERELAY_INGEST_STORE_PATH": str(tmp_path / "streams.json")}  # fmt: skip
    worker = f"ws://127.0.0.1:{free_port()}/v1/tunnel"  # nobody there
    proc = subprocess.Popen(
        [sys.executable, "-m", "framerelay", "ingest", "--worker-url", worker,
         "--api-port", str(port)],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30 * TIMEOUT_FACTOR
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                return proc, port
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError("ingest did not start")
        time.sleep(0.1)


async def _six_mb(port: int, token: str, n: int) -> list[int]:
    """``n`` requests with a 6 MB body, alternately Content-Length and chunked."""
    data = _stream_json("cam-huge", 6 * MiB)
    statuses = []
    for i in range(n):
        conn = await Connection.open(port)
        try:
            if i % 2 == 0:
                req = head("POST", "/v1/streams", token=token, length=len(data))
                answer = await conn.exchange(req, plain(data), 30)
            else:
                req = head("POST", "/v1/streams", token=token, chunked=True)
                answer = await conn.exchange(req, chunked(data), 30)
            statuses.append(answer.status)
        finally:
            await conn.close()
    return statuses


@pytest.mark.integration
async def test_six_megabyte_bodies_do_not_grow_a_real_ingest(tmp_path: Path, secret: str) -> None:
    proc, port = _start_ingest(tmp_path, secret)
    token = mint(secret, ["streams:read", "streams:write"], "ingest", ttl=600)
    try:
        await _six_mb(port, token, 4)  # warm-up: first allocations, code paths
        before = _rss_kib(proc.pid)
        t0 = time.monotonic()
        statuses = await _six_mb(port, token, 20)
        elapsed = time.monotonic() - t0
        after = _rss_kib(proc.pid)
        async with httpx.AsyncClient() as http:
            listed = await http.get(
                f"http://127.0.0.1:{port}/v1/streams", headers={"Authorization": f"Bearer {token}"}
            )
        streams = listed.json()
    finally:
        proc.terminate()
        proc.wait(30)
    grew = (after - before) / 1024
    print(f"\n20 x 6 MB bodies (10 Content-Length, 10 chunked) in {elapsed:.1f} s: "
          f"statuses {sorted(set(statuses))}; ingest RSS {before / 1024:.1f} -> "
          f"{after / 1024:.1f} MiB ({grew:+.2f} MiB)")  # fmt: skip
    assert statuses == [413] * 20
    assert streams == []
    assert grew < 5, f"RSS grew {grew:.1f} MiB"


async def test_a_refused_chunked_body_is_freed_at_once(tmp_path: Path) -> None:
    """No reference cycle keeps the partial body until the next full collection."""

    tracemalloc.start()
    try:
        async with running_ingest("s" * 32, tmp_path) as ingest:
            data, held = _stream_json("cam-big", 2 * MiB), []
            for _ in range(3):
                gc.collect()
                gc.disable()
                try:
                    start = tracemalloc.get_traced_memory()[0]
                    async with connection(_port(ingest.base)) as conn:
                        req = head("POST", "/v1/streams", token=ingest.token(), chunked=True)
                        assert (await conn.exchange(req, chunked(data))).status == 413
                    held.append((tracemalloc.get_traced_memory()[0] - start) / 1024)
                finally:
                    gc.enable()
    finally:
        tracemalloc.stop()
    print(f"\nheld after a refused 2 MiB chunked body, before any collection: {held} KiB")
    assert max(held[1:]) < 256, held
