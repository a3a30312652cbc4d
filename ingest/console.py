"""The operator console: a web page served by the ingest, and the live data it reads.

* ``GET /console`` - the page (open: it holds no data). It asks for a token,
  keeps it in the browser tab (``sessionStorage``) and sends it as
  ``Authorization: Bearer`` on every request; nothing is stored server-side.
* ``GET /console/assets/{name}`` - its script and style sheet, from the package
  (no CDN, no build step).
* ``GET /v1/console/session`` (``streams:read``, the viewer's scope) - who the
  token names, its scopes and expiry, and whether it may change streams (the
  page shows add/edit/remove only then).
* ``GET /v1/console/streams`` (``streams:read``) - server-sent events: a
  ``streams`` event every :data:`EVERY_S` (one row per stream, see
  :mod:`ingest.console_summary`, and the worker tunnels).
* ``GET /v1/console/streams/{stream_id}/live`` (``results:<id>``, checked before
  anything else, like the results WebSocket) - server-sent ``frame`` events: each
  result of the stream with the JPEG the ingest sent for that very frame
  (matched by epoch and seq: :mod:`ingest.console_frames`).

Both event streams end with an ``expired`` event when the token expires or no
longer verifies (revoked: checked again every 2 s; the page asks for a new
one), and are capped at :data:`MAX_VIEWERS` open at once
(503 beyond). Browsers' ``EventSource`` cannot send headers, so the page reads
them with ``fetch``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import HTMLResponse, StreamingResponse
from pydantic import BaseModel, Field

from framerelay.auth import Claims, bearer_token
from framerelay.auth.tokens import SessionToken
from framerelay.auth.web import ApiAuth, AuthFirstRoute
from framerelay.openapi_docs import errors
from ingest.bus import Published
from ingest.console_frames import SentFrame, SentFrames
from ingest.console_summary import Rates, snapshot
from ingest.service import IngestService
from ingest.stream import IngestStream

EVERY_S = 1.0
"""The streams table's refresh period."""
RECHECK_S = 2.0
"""An open event stream's token is verified again this often (revoked: it ends; a quiet
live view checks at its next frame or keepalive)."""
KEEPALIVE_S = 15.0
"""A comment line this often on a quiet live view keeps proxies from closing it."""
MAX_VIEWERS = 32
"""Console event streams open at once (both kinds together)."""
ASSETS = {"console.js": "text/javascript", "console_jobs.js": "text/javascript",
          "console.css": "text/css"}  # fmt: skip
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data: blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
WORKER_FIELDS = ("url", "worker_id", "state", "stall_reason", "rtt_p95_ms", "stalls")
EVENT_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


class ConsoleSession(BaseModel):
    """Who the console's token names, and what the page may show."""

    subject: str
    scopes: list[str]
    expires_at: int = Field(description="Unix time the token expires.")
    can_write: bool = Field(description="The token grants streams:write (add, edit, remove).")


def event(name: str, data: str) -> str:
    """One server-sent event (``data`` is one line of JSON)."""
    return f"event: {name}\ndata: {data}\n\n"


class Viewers:
    """How many console event streams are open (bounded by :data:`MAX_VIEWERS`)."""

    def __init__(self, limit: int = MAX_VIEWERS) -> None:
        self.limit = limit
        self.open = 0

    def check(self) -> None:
        """503 when :attr:`limit` are open (the stream counts itself once it starts: a
        response the client left before it started never held a place)."""
        if self.open >= self.limit:
            raise HTTPException(503, f"{self.limit} console views are open; close one first")


def console_router(service: IngestService, api: ApiAuth) -> APIRouter:
    router = APIRouter(route_class=AuthFirstRoute, tags=["console"])
    read = api.requires("streams:read")
    results = api.requires("results:{stream_id}")  # the stream the path names
    viewers = Viewers()
    table = TableFeed(service)

    @router.get("/console", include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(_asset("console.html").decode(), headers=PAGE_HEADERS)

    @router.get("/console/assets/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in ASSETS:
            raise HTTPException(404, f"no asset {name!r}")
        return Response(
            _asset(name), media_type=ASSETS[name], headers={"Cache-Control": "no-cache"}
        )

    @router.get("/v1/console/session", summary="The console's session")
    async def session(claims: Claims = read) -> ConsoleSession:
        """Who the token names, its scopes and expiry; whether it may change streams."""
        can_write = claims.allows("streams:write")
        return ConsoleSession(
            subject=claims.sub,
            scopes=list(claims.scope),
            expires_at=claims.exp,
            can_write=can_write,
        )

    @router.get("/v1/console/streams", summary="Streams table (server-sent events)",
                responses=errors(503), response_class=StreamingResponse)  # fmt: skip
    async def streams(request: Request, claims: Claims = read) -> StreamingResponse:
        """A ``streams`` event every second: one row per stream (state, epoch, fps in and
        out, drops by reason, latency p50/p99 and SLO, worker) and the worker tunnels."""
        viewers.check()
        watch = Watch(claims, _session_token(api, request))
        return StreamingResponse(
            _table(table, watch, viewers), media_type="text/event-stream", headers=EVENT_HEADERS
        )

    @router.get("/v1/console/streams/{stream_id}/live", responses=errors(404, 503),
                summary="Live view of one stream (server-sent events)",
                response_class=StreamingResponse)  # fmt: skip
    async def live(request: Request, stream_id: str, claims: Claims = results) -> StreamingResponse:
        """``frame`` events: each result of the stream with the JPEG the ingest sent for
        that frame (base64) and its letterbox. Needs ``results:<stream_id>``."""
        if stream_id not in service.streams:
            raise HTTPException(404, f"no stream {stream_id!r}")
        viewers.check()
        frames = _live(service, stream_id, Watch(claims, _session_token(api, request)), viewers)
        return StreamingResponse(frames, media_type="text/event-stream", headers=EVENT_HEADERS)

    return router


def _asset(name: str) -> bytes:
    return resources.files("ingest.console_assets").joinpath(name).read_bytes()


def _workers(service: IngestService) -> list[dict[str, Any]]:
    """The worker tunnels: name, worker, state (and why stalled), streams, RTT, stalls."""
    rows = []
    for name, tunnel in list(service.registry.clients.items()):
        info = tunnel.describe()
        row = {k: info.get(k) for k in WORKER_FIELDS}
        row["name"], row["streams"] = name, len(tunnel.streams)
        rows.append(row)
    return rows


class TableFeed:
    """The ``streams`` event, built at most once per :data:`EVERY_S` and shared by every
    console watching (rows cost about 70 us per stream once results flow)."""

    def __init__(self, service: IngestService) -> None:
        self.service = service
        self.rates = Rates()
        self.built_at = -EVERY_S
        self.text = ""

    def read(self) -> str:
        now = time.monotonic()
        if now - self.built_at >= 0.9 * EVERY_S:  # one build per tick, whoever asks first
            registry = self.service.registry
            rows = snapshot(self.service.streams, registry.where, registry.default, self.rates)
            body = {"at": time.time(), "streams": rows, "workers": _workers(self.service)}
            self.text = event("streams", json.dumps(body, allow_nan=False, default=str))
            self.built_at = now
        return self.text


def _session_token(api: ApiAuth, request: Request) -> SessionToken:
    token = bearer_token(request.headers.get("authorization"))
    return SessionToken(api.guard.verifier, token, every_s=RECHECK_S)


class Watch:
    """Why an event stream must end for its token (None while it may go on)."""

    def __init__(self, claims: Claims, token: SessionToken) -> None:
        self.claims = claims
        self.token = token

    def ended(self) -> str | None:
        if time.time() >= self.claims.exp:
            return "the token expired: sign in again"
        refused = self.token.refused()
        return f"{refused}: sign in again" if refused is not None else None

    def event(self, why: str) -> str:
        return event("expired", json.dumps({"reason": why}))


async def _table(feed: TableFeed, watch: Watch, viewers: Viewers) -> AsyncIterator[str]:
    viewers.open += 1
    try:
        while (why := watch.ended()) is None:
            yield feed.read()
            # wake on the next whole tick: every viewer at once, one build, 1 event/s exactly
            await asyncio.sleep(EVERY_S - time.monotonic() % EVERY_S)
        yield watch.event(why)
    finally:
        viewers.open -= 1


async def _live(
    service: IngestService, stream_id: str, watch: Watch, viewers: Viewers
) -> AsyncIterator[str]:
    viewers.open += 1
    sub = service.bus.subscribe(maxsize=8, streams=frozenset({stream_id}))
    watched: IngestStream | None = None
    try:
        yield ": live view of " + stream_id + "\n\n"
        while (why := watch.ended()) is None:
            stream = service.streams.get(stream_id)
            if stream is None:
                yield event("gone", json.dumps({"reason": f"stream {stream_id} was removed"}))
                return
            if stream is not watched:  # a new definition is a new stream object
                _unwatch(watched)
                watched = _watch(stream)
            try:
                item = await asyncio.wait_for(sub.get(), timeout=KEEPALIVE_S)
            except TimeoutError:
                yield ": keepalive\n\n"
                continue
            kept = watched.sent_frames
            frame = kept.take(item.record.epoch, item.record.seq) if kept is not None else None
            if frame is not None and frame.pts == item.record.pts:  # the same frame, twice over
                yield event("frame", frame_event(item, frame))
        yield watch.event(why)
    finally:
        sub.close()
        _unwatch(watched)
        viewers.open -= 1


def _watch(stream: IngestStream) -> IngestStream:
    if stream.sent_frames is None:
        stream.sent_frames = SentFrames()
    stream.sent_frames.viewers += 1
    return stream


def _unwatch(stream: IngestStream | None) -> None:
    kept = stream.sent_frames if stream is not None else None
    if stream is None or kept is None:
        return
    kept.viewers -= 1
    if kept.viewers <= 0:
        stream.sent_frames = None


def frame_event(item: Published, frame: SentFrame) -> str:
    """The ``frame`` event: the result as the API gives it (its shared JSON) and the JPEG
    it was found on, with the part of the JPEG that holds the source (top-left)."""
    lb = frame.prepared.letterbox
    meta = {
        "epoch": frame.epoch, "seq": frame.seq, "pts": frame.pts, "src_w": lb.src_w,
        "src_h": lb.src_h, "new_w": lb.new_w, "new_h": lb.new_h, "pad_x": lb.pad_x,
        "pad_y": lb.pad_y, "jpeg": base64.b64encode(frame.prepared.data).decode("ascii"),
    }  # fmt: skip
    return f'{{"result":{item.json()},"frame":{json.dumps(meta)}}}'
