"""A request body cap for every HTTP API: a small pure ASGI middleware.

``app.add_middleware(BodyLimit, max_bytes=..., setting="FRAMERELAY_INGEST_MAX_BODY_BYTES")``

* A request whose ``Content-Length`` is over the limit is answered 413 at once,
  before any route (so before its token is checked) and without reading a byte
  of its body; the server discards the body as it arrives. When the connection
  must close after the answer (``Connection: close``, HTTP/1.0), closing it
  with the body still arriving would reset it and the client would lose the
  413: the listener (:mod:`framerelay.listeners`) then shuts its write side and
  reads and discards the rest for a bounded time before it closes.
* A body without a length (``Transfer-Encoding: chunked``) is counted as the
  application reads it: the read that passes the limit raises
  :class:`BodyTooLarge` inside the application, whose answer is replaced by the
  413. The application holds at most the limit plus one chunk. Routes that
  check their token before reading the body
  (:class:`framerelay.auth.web.AuthFirstRoute`) answer an unauthenticated
  chunked request 401 without reading it.

:class:`BodyTooLarge` is a Starlette ``HTTPException`` (413) so that FastAPI
passes it on untouched: any other exception is wrapped into a 400 whose
traceback cycle keeps the partial body (up to the limit) alive until the next
full garbage collection - megabytes per refused request.
* WebSocket and lifespan scopes pass through untouched (WebSocket messages have
  their own size limit).

The 413 is JSON: ``{"detail": "request body over the limit of N bytes (SETTING)",
"limit_bytes": N}``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.exceptions import HTTPException

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_MAX_BODY_BYTES = 1 << 20
"""1 MiB: far above any stream definition or control request."""


class BodyTooLarge(HTTPException):
    """Raised into the application by ``receive`` once the body passes the limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body over {limit} bytes")


def content_length(scope: Scope) -> int | None:
    """The request's Content-Length, None when absent or unparsable."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyLimit:
    """Answer 413 to any HTTP request whose body is larger than ``max_bytes``."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 setting: str | None = None) -> None:  # fmt: skip
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.app = app
        self.max_bytes = max_bytes
        where = f" ({setting})" if setting else ""
        body = {"detail": f"request body over the limit of {max_bytes} bytes{where}",
                "limit_bytes": max_bytes}  # fmt: skip
        self._body = json.dumps(body).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = content_length(scope)
        if length is not None and length > self.max_bytes:
            await self._refuse(send)
            return
        await _Counted(self, receive, send).run(scope)

    async def _refuse(self, send: Send) -> None:
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(self._body)).encode())]  # fmt: skip
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": self._body})


class _Counted:
    """One request whose body is counted as the application reads it."""

    def __init__(self, limit: BodyLimit, receive: Receive, send: Send) -> None:
        self.limit = limit
        self._receive = receive
        self._send = send
        self.seen = 0
        self.over = False
        self.started = False

    async def run(self, scope: Scope) -> None:
        try:
            await self.limit.app(scope, self.receive, self.send)
        except Exception:
            if not self.over or self.started:
                raise
        if self.over and not self.started:
            self.started = True
            await self.limit._refuse(self._send)

    async def receive(self) -> Message:
        if self.over:
            raise BodyTooLarge(self.limit.max_bytes)
        message = await self._receive()
        if message["type"] == "http.request":
            self.seen += len(message.get("body", b""))
            if self.seen > self.limit.max_bytes:
                self.over = True
                raise BodyTooLarge(self.limit.max_bytes)
        return message

    async def send(self, message: Message) -> None:
        if self.over and not self.started:
            return  # the application's answer to the failed read: the 413 replaces it
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)
