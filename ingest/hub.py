"""Result hub: the WebSocket API that fans results out to subscribers.

``WS /v1/results?stream=ID[&class=NAME][&min_confidence=F][&resume=ID@DURABLE_ID]``
(the query form of :class:`framerelay.schemas.Subscription`). The client sends
``Authorization: Bearer <token>``: a token for audience ``framerelay-ingest``
granting ``results:<id>`` for every stream the request names anywhere
(``stream`` and ``resume``; ``results:*`` for all: :func:`required_scopes`, the
one rule), and a resumed stream must also be received. Refusals happen before
the handshake completes, so no result is ever sent on them: HTTP 400 (bad
subscription), 401 (missing, malformed, badly signed, expired, not yet valid or
for another service), 403 (stream not granted), 429 (too many failed
authentications from this address; with ``Retry-After``), 503 (too many
subscribers), each with an :class:`~framerelay.schemas.ErrorMessage` body.

After the handshake the hub sends ``subscribed``, any replayed results (resume),
then live ``result`` messages: each the
:class:`~framerelay.schemas.ResultMessage` of the bus's record, under the id the
bus settled (the one Redis and sidecars use), encoded once per detection filter
and shared by its subscribers. Query parameters are an API input, so unknown
ones are refused (400). Each subscriber has a bounded queue: when full the
oldest result is dropped, and every result message carries the subscriber's
``dropped`` total (plus a ``notice`` at most once a second while drops grow). A
send that blocks for ``send_timeout_s`` closes the connection with 4408; a token
expiring mid-session closes it with 4401 (``token_expired``), and so does one
revoked mid-session (``unauthorized``: the token is verified again every
``recheck_s``). One sender task per subscriber: a slow or dead subscriber only
ever waits on itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import ValidationError

from framerelay.auth import AuthGuard, Claims, Forbidden, Throttled, Unauthorized, bearer_token
from framerelay.auth.tokens import SessionToken
from framerelay.errors import FramerelayError
from framerelay.results import ResultId
from framerelay.schemas import (
    HTTP_STATUS,
    CloseCode,
    ErrorCode,
    ErrorMessage,
    NoticeMessage,
    SubscribedMessage,
    Subscription,
)
from ingest.auth import api_guard
from ingest.bus import DetectionFilter, Published, ResultBus
from ingest.bus import Subscription as _Queue
from ingest.settings import IngestSettings

log = logging.getLogger(__name__)
NOTICE_EVERY_S = 1.0
CLOSE_WAIT_S = 1.0
_DELAY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0, 5.0)

DurableRange = Callable[[str, ResultId, int], Awaitable[list[Published]]]
"""``(stream_id, after, count) -> results`` newer than ``after`` (Redis XRANGE)."""
QUERY_PARAMETERS = frozenset({"stream", "class", "min_confidence", "resume"})


class Refused(FramerelayError):
    """A subscription the hub turns down before the handshake completes."""

    def __init__(self, code: ErrorCode, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.code in ("unauthorized", "token_expired"):
            out["WWW-Authenticate"] = 'Bearer realm="framerelay", error="invalid_token"'
        elif self.code == "forbidden":
            out["WWW-Authenticate"] = 'Bearer realm="framerelay", error="insufficient_scope"'
        if self.retry_after_s is not None:
            out["Retry-After"] = str(max(1, round(self.retry_after_s)))
        return out


class HubMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.subscribers = Gauge(
            "framerelay_hub_subscribers", "Open WebSocket subscribers", registry=r
        )
        self.sent = Counter("framerelay_hub_results_sent", "Result messages sent", registry=r)
        self.dropped = Counter(
            "framerelay_hub_results_dropped",
            "Results dropped for a subscriber whose queue was full",
            registry=r,
        )
        self.refused = Counter(
            "framerelay_hub_refused", "Refused subscriptions, by reason", ["code"], registry=r
        )
        self.closed = Counter(
            "framerelay_hub_disconnects", "Subscriber disconnects, by reason", ["reason"],
            registry=r,
        )  # fmt: skip
        self.delay_s = Histogram(
            "framerelay_hub_delivery_delay_seconds",
            "From the ingest receiving a result to the hub finishing its send",
            buckets=_DELAY_BUCKETS,
            registry=r,
        )


@dataclass(frozen=True, slots=True)
class HubConfig:
    queue_size: int = 256
    send_timeout_s: float = 5.0
    max_subscribers: int = 1000
    resume_max: int = 2000
    token_leeway_s: float = 30.0  # as the verifier's: a token just accepted is not cut at once
    recheck_s: float = 2.0
    """An open session's token is verified again this often (a revoked one ends it)."""


class _Ended(Exception):
    """A session ends for its token: why, said to the subscriber before the close."""

    def __init__(self, code: ErrorCode, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


@dataclass(slots=True)
class _Session:
    """One subscriber's delivery state."""

    subscription: Subscription
    filt: DetectionFilter
    expires_at: float | None
    token: SessionToken | None = None
    last_sent: dict[str, ResultId] = field(default_factory=dict)
    reported_drops: int = 0
    last_notice: float = 0.0


def parse_query(ws: WebSocket) -> Subscription:
    """The query string as a :class:`Subscription` (:class:`Refused` if invalid)."""
    q = ws.query_params
    unknown = sorted(set(q.keys()) - QUERY_PARAMETERS)
    if unknown:
        raise Refused("bad_request", f"unknown query parameter {unknown[0][:40]!r}; known: "
                      f"{', '.join(sorted(QUERY_PARAMETERS))}")  # fmt: skip
    classes = [c.strip() for raw in q.getlist("class") for c in raw.split(",") if c.strip()]
    resume: dict[str, str] = {}
    try:
        for item in q.getlist("resume"):
            sid, sep, rid = item.rpartition("@")
            if not sep:
                raise ValueError(f"resume must be <stream>@<id>, got {item[:80]!r}")
            resume[sid] = rid
        return Subscription(
            streams=list(dict.fromkeys(q.getlist("stream"))),
            classes=classes or None,
            min_confidence=float(q.get("min_confidence", "0")),
            resume=resume,
        )
    except (ValidationError, ValueError) as exc:
        raise Refused("bad_request", f"invalid subscription: {_short(exc)}") from None


def required_scopes(sub: Subscription) -> list[str]:
    """What a results request needs, the one rule every check uses: ``results:<id>`` for
    every stream it names anywhere (``stream=``, ``resume=``), and ``results:*`` when it
    names none to receive (then it receives every stream)."""
    if not sub.streams:
        return ["results:*"]
    return [f"results:{s}" for s in dict.fromkeys([*sub.streams, *sub.resume])]


def _short(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])
    return str(exc)[:200]


class ResultHub:
    """Authorizes subscribers and pumps results to them."""

    def __init__(
        self,
        bus: ResultBus,
        *,
        guard: AuthGuard,
        config: HubConfig | None = None,
        registry: CollectorRegistry | None = None,
        durable: DurableRange | None = None,
    ) -> None:
        self.bus = bus
        self.guard = guard
        self.config = config or HubConfig()
        self.metrics = HubMetrics(registry or CollectorRegistry())
        self.durable = durable
        self.active = 0

    def authorize(self, sub: Subscription, authorization: str | None, peer: str) -> Claims:
        """Check the token against every stream named (:func:`required_scopes`), that
        every resumed stream is received, then capacity; :class:`Refused`."""
        claims = self._claims(sub, authorization, peer)
        stray = [s for s in sub.resume if sub.streams and s not in sub.streams]
        if stray:
            why = f"resume names stream {stray[0]!r}, which this subscription does not receive"
            raise Refused("bad_request", f"{why}; add stream={stray[0]}")
        if self.active >= self.config.max_subscribers:
            raise Refused("capacity", f"the hub serves at most {self.config.max_subscribers} "
                          "subscribers; try again later")  # fmt: skip
        return claims

    def _claims(self, sub: Subscription, authorization: str | None, peer: str) -> Claims:
        scopes = required_scopes(sub)
        try:
            claims = self.guard.check(authorization, scopes[0], peer)
        except Throttled as exc:
            raise Refused("throttled", str(exc), exc.retry_after_s) from None
        except Forbidden as exc:
            raise Refused("forbidden", str(exc)) from None
        except Unauthorized as exc:
            code: ErrorCode = "token_expired" if exc.reason == "expired" else "unauthorized"
            raise Refused(code, str(exc)) from None
        for scope in scopes[1:]:
            if not claims.allows(scope):
                self.guard.refused(Forbidden.reason)
                raise Refused("forbidden", f"token for {claims.sub!r} does not grant {scope!r}")
        return claims

    async def handle(self, ws: WebSocket) -> None:
        """The whole life of one subscriber connection."""
        peer = ws.client.host if ws.client is not None else "unknown"
        try:
            sub = parse_query(ws)
            claims = self.authorize(sub, ws.headers.get("authorization"), peer)
        except Refused as exc:
            await self._deny(ws, exc)
            return
        session = _Session(
            subscription=sub,
            filt=DetectionFilter(
                frozenset(sub.classes) if sub.classes is not None else None, sub.min_confidence
            ),
            expires_at=float(claims.exp),
            token=SessionToken(
                self.guard.verifier,
                bearer_token(ws.headers.get("authorization")),
                every_s=self.config.recheck_s,
            ),
        )
        await ws.accept()
        self.active += 1
        self.metrics.subscribers.inc()
        try:
            reason = await self._serve(ws, session)
        finally:
            self.active -= 1
            self.metrics.subscribers.dec()
        self.metrics.closed.labels(reason).inc()

    async def _deny(self, ws: WebSocket, exc: Refused) -> None:
        """Refuse the handshake with an HTTP answer (no result is ever sent)."""
        self.metrics.refused.labels(exc.code).inc()
        status = HTTP_STATUS[exc.code]
        body = ErrorMessage(code=exc.code, message=str(exc), http_status=status)
        answer = JSONResponse(body.model_dump(), status_code=status, headers=exc.headers())
        try:
            await ws.send_denial_response(answer)
        except RuntimeError:  # a server without the denial-response extension: plain 403
            await ws.close(code=1008, reason=exc.code)

    async def _serve(self, ws: WebSocket, session: _Session) -> str:
        sub = session.subscription
        queue = self.bus.subscribe(
            maxsize=self.config.queue_size,
            streams=frozenset(sub.streams) if sub.streams else None,
            on_drop=self.metrics.dropped.inc,
        )
        sender = asyncio.create_task(self._send_all(ws, session, queue))
        reader = asyncio.create_task(_drain_client(ws))
        try:
            await asyncio.wait({sender, reader}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            queue.close()
            for task in (sender, reader):
                task.cancel()
            await asyncio.gather(sender, reader, return_exceptions=True)
        if sender.done() and not sender.cancelled() and sender.exception() is None:
            return sender.result()
        return "client_closed"

    async def _send_all(self, ws: WebSocket, session: _Session, queue: _Queue) -> str:
        """Send until something ends the session; return why."""
        try:
            replay = await self._replay(session)
            await self._send(ws, self._subscribed(session, replay))
            for stream_id, held in replay.items():
                await self._gap_notice(ws, session, stream_id)
                for old in held:
                    await self._send_result(ws, session, old, queue.dropped)
            while True:
                try:
                    item = await self._next(queue, session)
                except _Ended as end:
                    await self._close(ws, end.code, CloseCode.TOKEN_EXPIRED, end.text)
                    return end.code
                await self._send_result(ws, session, item, queue.dropped)
                await self._maybe_notice(ws, session, queue.dropped)
        except TimeoutError:
            with contextlib.suppress(Exception):
                await self._close(ws, "too_slow", CloseCode.TOO_SLOW,
                                  f"a send blocked for {self.config.send_timeout_s} s")  # fmt: skip
            return "too_slow"
        except (WebSocketDisconnect, RuntimeError, OSError):
            return "client_closed"

    async def _next(self, queue: _Queue, session: _Session) -> Published:
        """The next queued result; :class:`_Ended` once the token expired or was revoked."""
        while True:
            self._recheck(session)
            wait = self.config.recheck_s
            if session.expires_at is not None:
                left = session.expires_at + self.config.token_leeway_s - time.time()
                if left <= 0:
                    raise _Ended("token_expired", "token expired; reconnect with a fresh one")
                wait = min(wait, left)
            try:
                async with asyncio.timeout(wait):
                    return await queue.get()
            except TimeoutError:
                continue

    def _recheck(self, session: _Session) -> None:
        """:class:`_Ended` once the session's token no longer verifies (revoked)."""
        refused = session.token.refused() if session.token is not None else None
        if refused is not None:
            self.guard.refused(refused.reason)
            raise _Ended("unauthorized", f"{refused}; the session ends")

    async def _send(self, ws: WebSocket, text: str) -> None:
        async with asyncio.timeout(self.config.send_timeout_s):
            await ws.send_text(text)

    async def _send_result(
        self, ws: WebSocket, session: _Session, item: Published, dropped: int
    ) -> None:
        last = session.last_sent.get(item.stream_id)
        if last is not None and item.id <= last:
            return  # already sent during the replay
        await self._send(ws, item.message(session.filt, dropped))
        session.last_sent[item.stream_id] = item.id
        self.metrics.sent.inc()
        self.metrics.delay_s.observe(max(0.0, time.time() - item.record.received_at))

    async def _maybe_notice(self, ws: WebSocket, session: _Session, dropped: int) -> None:
        now = time.monotonic()
        if dropped > session.reported_drops and now - session.last_notice >= NOTICE_EVERY_S:
            new = dropped - session.reported_drops
            session.reported_drops, session.last_notice = dropped, now
            note = NoticeMessage(
                code="dropped",
                message=f"{new} result(s) dropped: this subscriber reads slower than results "
                f"arrive (queue of {self.config.queue_size})",
                dropped=dropped,
            )
            await self._send(ws, note.model_dump_json())

    async def _gap_notice(self, ws: WebSocket, session: _Session, stream_id: str) -> None:
        """Told when nothing newer than the resume point could be found to replay."""
        after = session.subscription.resume[stream_id]
        oldest = self.bus.oldest(stream_id)
        if oldest is not None and oldest > after and self.durable is None:
            note = NoticeMessage(
                code="gap", stream_id=stream_id,
                message=f"results between {after} and {oldest} are no longer held; "
                "enable Redis for longer resumes",
            )  # fmt: skip
            await self._send(ws, note.model_dump_json())

    def _subscribed(self, session: _Session, replay: dict[str, list[Published]]) -> str:
        return SubscribedMessage(
            subscription=session.subscription,
            queue_size=self.config.queue_size,
            send_timeout_s=self.config.send_timeout_s,
            expires_at=session.expires_at,
            replay={k: len(v) for k, v in replay.items()},
            durable=self.durable is not None,
        ).model_dump_json()

    async def _replay(self, session: _Session) -> dict[str, list[Published]]:
        """Results after each resume point: Redis (older) + the bus history (newest)."""
        out: dict[str, list[Published]] = {}
        for stream_id, after in session.subscription.resume.items():
            # the durable ones are older and sort first: the oldest resume_max held suffice
            held = self.bus.history(stream_id, after, max(1, self.config.resume_max))
            items: dict[ResultId, Published] = {p.id: p for p in held}
            oldest = held[0].id if held else None
            if self.durable is not None and (oldest is None or oldest > after):
                for stored in await self._durable(self.durable, stream_id, after):
                    items.setdefault(stored.id, stored)
            out[stream_id] = [items[k] for k in sorted(items)][: self.config.resume_max]
        return out

    async def _durable(
        self, durable: DurableRange, stream_id: str, after: ResultId
    ) -> list[Published]:
        try:
            async with asyncio.timeout(self.config.send_timeout_s):
                return await durable(stream_id, after, self.config.resume_max)
        except (TimeoutError, OSError, FramerelayError) as exc:
            log.warning("resume of %s from Redis failed: %s", stream_id, exc)
            return []

    async def _close(self, ws: WebSocket, code: ErrorCode, close: CloseCode, text: str) -> None:
        """Say why (bounded: a peer that does not read gets no say) and close."""
        msg = ErrorMessage(code=code, message=text, close_code=int(close)).model_dump_json()
        async with asyncio.timeout(CLOSE_WAIT_S):
            await ws.send_text(msg)
            await ws.close(code=int(close), reason=code)


async def _drain_client(ws: WebSocket) -> None:
    """Subscribers send nothing we act on; return when they disconnect."""
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return


def results_router(hub: ResultHub) -> APIRouter:
    router = APIRouter()

    @router.websocket("/v1/results")
    async def results(ws: WebSocket) -> None:
        await hub.handle(ws)

    return router


def build_hub(
    bus: ResultBus,
    settings: IngestSettings,
    registry: CollectorRegistry,
    durable: DurableRange | None = None,
    *,
    guard: AuthGuard | None = None,
) -> ResultHub:
    """The hub as the ingest's settings describe it (``guard``: the API's, else a new one
    on ``registry``; ConfigError when the settings hold no keys to verify tokens)."""
    r = settings.results
    config = HubConfig(
        r.queue_size, r.send_timeout_s, r.max_subscribers, r.resume_max, settings.token_leeway_s
    )
    return ResultHub(
        bus,
        guard=guard or api_guard(settings, registry),
        config=config,
        registry=registry,
        durable=durable,
    )
