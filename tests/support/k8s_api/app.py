"""The contract Kubernetes API server over HTTP: every request to :meth:`Rest.handle`
(in a thread), a watch as a stream of newline-delimited JSON events
(``{"type": "ADDED|MODIFIED|DELETED|BOOKMARK|ERROR", "object": ...}``) held open
until its ``timeoutSeconds``, :meth:`Store.drop_watches` or the server's end. A watch
from a version the history no longer reaches gets one ``ERROR`` event holding a
``Status`` (410, ``Expired``) and ends, as the API server's watch cache answers."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.support.k8s_api.resources import Obj, status_object
from tests.support.k8s_api.rest import Rest, WatchSpec
from tests.support.k8s_api.store import Event, Expired

JSON = "application/json"
POLL_S = 0.02
"""How often an open watch looks for new events."""


def _line(kind: str, obj: Obj) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


async def watch_stream(rest: Rest, spec: WatchSpec, bookmark_s: float) -> AsyncIterator[bytes]:
    """The events of one watch, as lines (counted in :attr:`Store.watching` while open)."""
    store = rest.store
    with store.lock:
        store.watching += 1
    try:
        async for line in _events(rest, spec, bookmark_s):
            yield line
    finally:
        with store.lock:
            store.watching -= 1


async def _events(rest: Rest, spec: WatchSpec, bookmark_s: float) -> AsyncIterator[bytes]:
    store, resource = rest.store, spec.target.resource
    epoch = store.watch_epoch
    with store.lock:
        rv = store.rv if spec.rv is None else spec.rv
        initial = [] if spec.rv is not None else store.items(resource.plural, spec.target.namespace)
    for obj in initial:
        if spec.match(obj):
            yield _line("ADDED", rest.shown(resource, obj))
    started = last_sent = time.monotonic()
    while store.watch_epoch == epoch and not store.closing:
        if spec.timeout_s is not None and time.monotonic() - started >= spec.timeout_s:
            return
        try:
            events: list[Event] = store.since(rv, resource.plural, spec.target.namespace)
        except Expired as exc:
            rest.count_expired()  # told in the stream, as a server that compacts while watched
            yield _line("ERROR", status_object(410, "Expired", str(exc)))
            return
        for event in events:
            rv = event.rv
            if spec.match(event.obj):
                last_sent = time.monotonic()
                yield _line(event.type, rest.shown(resource, event.obj))
        if spec.bookmarks and time.monotonic() - last_sent >= bookmark_s:
            last_sent = time.monotonic()
            with store.lock:  # the version of this watch's epoch, never one past its end
                if store.watch_epoch != epoch:
                    return
                mark = {
                    "kind": resource.kind,
                    "apiVersion": resource.api_version,
                    "metadata": {"resourceVersion": str(max(rv, store.rv))},
                }
            yield _line("BOOKMARK", mark)
        await asyncio.sleep(POLL_S)


def create_app(rest: Rest, bookmark_s: float = 1.0) -> Starlette:
    async def endpoint(request: Request) -> Response:
        query: dict[str, list[str]] = {}
        for name, value in request.query_params.multi_items():
            query.setdefault(name, []).append(value)
        raw = await request.body()
        reply = await run_in_threadpool(
            rest.handle, request.method, request.url.path, query, dict(request.headers), raw
        )
        if reply.watch is not None:
            return StreamingResponse(watch_stream(rest, reply.watch, bookmark_s), media_type=JSON)
        return Response(json.dumps(reply.body), reply.status, media_type=JSON)

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    return Starlette(routes=[Route("/{path:path}", endpoint, methods=methods)])
