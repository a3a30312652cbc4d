"""What every HTTP listener enforces before a request is authenticated.

uvicorn (h11) has no deadline for a request head and no cap on connections: a
client that opens connections and sends half a header holds each one for as
long as it likes. :func:`uvicorn_options` wraps uvicorn's own HTTP protocol in
:class:`GuardedConnection`, which the ingest and orchestrator APIs serve with:

* at most ``max_connections`` connections in all (the concurrency limit) and
  ``max_connections_per_peer`` from one address (trusted proxies are exempt
  from the per-address cap). The connection over either cap is answered
  ``503`` without a byte of it being read, half-closed, and closed
  :data:`REFUSED_CLOSE_S` later.
* Every request head must be complete within ``header_timeout_s``: the first
  one from the moment the connection opens, later ones (keep-alive) from their
  first byte; otherwise ``408`` and the connection is closed.
* A kept-alive connection idle for ``keep_alive_s`` is closed (uvicorn's timer).
* A connection closed while its client still sends a request body (an early
  ``413`` to a ``Connection: close`` request) is closed gracefully: the write
  side is shut and what the client still sends is read and discarded for up to
  :data:`LINGER_S`, so the client reads the answer rather than a reset.
* ``X-Forwarded-For`` is believed only from ``trusted_proxies`` (uvicorn alone
  believes it from any local process), so ``request.client`` (the address the
  failed-login throttles count) is the peer, or the address a trusted proxy
  forwarded.

:class:`ConnectionLimiter` does the counting (no I/O); refusals are counted by
reason in :attr:`ConnectionLimiter.refused` and logged at most once per
:data:`LOG_EVERY_S`. A WebSocket upgrade keeps its connection counted until it
closes. With TLS, a connection is counted once its handshake is done (asyncio
bounds the handshake to 60 s).

The worker's listener (websockets, one request per connection) counts its
connections the same way with :class:`CountedServerConnection`; websockets'
``open_timeout`` is its deadline for the TLS handshake and the request head.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import time
from collections import Counter
from typing import Annotated, Any, ClassVar

import h11
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import NoDecode
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from framerelay.outbox import CoalescingServerConnection

log = logging.getLogger(__name__)

LINGER_S = 10.0
"""Longest a connection closed mid-request-body keeps reading (and discarding) it."""
LOG_EVERY_S = 10.0
REFUSED_CLOSE_S = 1.0
"""A refused connection is half-closed after its 503 and closed this much later, so a
client that already sent its request reads the 503 rather than a reset (at most
``max_connections`` such at a time; beyond, closed at once)."""
"""Refusals are logged at most this often (each line says how many since the last)."""

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class ListenerSettings(BaseModel):
    """The limits of one HTTP listener (every field documented in docs/security.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_connections: int = Field(
        2000,
        ge=1,
        le=1_000_000,
        description="Open connections at most (WebSockets included); one more is answered "
        "503 and closed.",
    )
    max_connections_per_peer: int = Field(
        100,
        ge=0,
        le=1_000_000,
        description="Open connections from one address at most (trusted proxies exempt); "
        "0 = no per-address cap.",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        le=600,
        allow_inf_nan=False,
        description="A request head must be complete this long after the connection opened "
        "(later requests: after their first byte); else 408 and the connection is closed.",
    )
    keep_alive_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="An idle kept-alive connection is closed after this long.",
    )
    trusted_proxies: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description="Addresses or CIDR networks of reverse proxies (JSON list or ','-separated): "
        "from them X-Forwarded-For names the client (throttles count that address); none by "
        "default.",
    )

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        """An environment variable: a JSON list, or ``,``-separated."""
        if not isinstance(value, str):
            return value
        if value.lstrip().startswith("["):
            try:
                return json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"not a JSON list ({exc.msg}); or give them ','-separated"
                ) from None
        return tuple(part for part in value.split(",") if part.strip())

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for item in value:
            try:
                out.append(str(ipaddress.ip_network(item.strip(), strict=False)))
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or CIDR network") from None
        return tuple(out)


class ConnectionLimiter:
    """Counts open connections per address and in all; says why one is refused."""

    def __init__(self, settings: ListenerSettings, setting: str) -> None:
        self.settings = settings
        self.setting = setting
        """The settings' environment prefix, named in refusals
        (``FRAMERELAY_INGEST_LISTENER``)."""
        self.open = 0
        self.refused: Counter[str] = Counter()
        """Refusals by reason: ``total``, ``per_peer``, ``header_timeout``."""
        self.refusing = 0
        """Refused connections between their 503 and their close (:func:`refuse`)."""
        self._per_peer: dict[str, int] = {}
        self._proxies: list[Network] = [ipaddress.ip_network(n) for n in settings.trusted_proxies]
        self._logged_at = -LOG_EVERY_S
        self._unlogged = 0

    def open_from(self, peer: str) -> int:
        return self._per_peer.get(peer, 0)

    def trusted(self, peer: str) -> bool:
        """True when ``peer`` is one of the trusted proxies."""
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(address in net for net in self._proxies)

    def admit(self, peer: str) -> str | None:
        """None: counted (:meth:`release` it when it closes); else why it is refused."""
        s = self.settings
        if self.open >= s.max_connections:
            return self._refuse(
                "total",
                f"the server holds its maximum of {s.max_connections} connections "
                f"({self.setting}__MAX_CONNECTIONS); retry",
            )
        cap = s.max_connections_per_peer
        if cap and self.open_from(peer) >= cap and not self.trusted(peer):
            return self._refuse(
                "per_peer",
                f"{cap} connections from {peer} are open already "
                f"({self.setting}__MAX_CONNECTIONS_PER_PEER)",
            )
        self.open += 1
        self._per_peer[peer] = self.open_from(peer) + 1
        return None

    def release(self, peer: str) -> None:
        self.open -= 1
        left = self.open_from(peer) - 1
        if left > 0:
            self._per_peer[peer] = left
        else:
            self._per_peer.pop(peer, None)

    def head_late(self, peer: str) -> str:
        """Count a request head that missed its deadline; the 408's text."""
        return self._refuse(
            "header_timeout",
            f"request head from {peer} not complete within {self.settings.header_timeout_s:g} s "
            f"({self.setting}__HEADER_TIMEOUT_S)",
        )

    def _refuse(self, reason: str, message: str) -> str:
        self.refused[reason] += 1
        self._unlogged += 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            since = self._unlogged
            log.warning("listener limit: %s (%d time(s) since the last such line)", message, since)
            self._logged_at, self._unlogged = now, 0
        return message


def answer(status: int, text: str) -> bytes:
    """A whole ``Connection: close`` HTTP/1.1 answer with a one-line text body."""
    body = (text + "\n").encode()
    phrase = {408: "Request Timeout", 503: "Service Unavailable"}.get(status, "Error")
    head = (
        f"HTTP/1.1 {status} {phrase}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n"
    )
    if status == 503:
        head += "retry-after: 1\r\n"
    return (head + "\r\n").encode() + body


def refuse(transport: asyncio.Transport, text: str, limiter: ConnectionLimiter) -> None:
    """Answer a connection over a cap 503 and close it, reading nothing of it."""
    transport.pause_reading()
    transport.write(answer(503, text))
    if not transport.can_write_eof() or limiter.refusing >= limiter.settings.max_connections:
        transport.close()
        return
    transport.write_eof()  # the 503, then FIN: read before the reset our close may cause
    limiter.refusing += 1

    def close() -> None:
        limiter.refusing -= 1
        transport.close()

    asyncio.get_running_loop().call_later(REFUSED_CLOSE_S, close)


def peer_of(transport: asyncio.BaseTransport) -> str:
    """The remote address as the server sees it."""
    name = transport.get_extra_info("peername")
    if isinstance(name, tuple) and name:
        return str(name[0])
    return "unknown"


def _awaiting_head(protocol: asyncio.BaseProtocol) -> bool:
    """Whether the HTTP protocol waits for (the rest of) a request head."""
    return isinstance(protocol, H11Protocol) and protocol.conn.their_state is h11.IDLE


def _sending_body(protocol: asyncio.BaseProtocol) -> bool:
    """Whether the client is still sending a request body nobody will read."""
    return isinstance(protocol, H11Protocol) and protocol.conn.their_state is h11.SEND_BODY


class GuardedConnection(asyncio.Protocol):
    """One accepted connection: uvicorn's protocol inside, the limits around it.

    The transport's protocol stays this object for the connection's whole life;
    uvicorn's protocol (and, after an upgrade, its WebSocket protocol) gets a
    :class:`_Transport` whose ``set_protocol`` swaps what this forwards to.
    """

    limiter: ClassVar[ConnectionLimiter]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.loop = _loop or asyncio.get_running_loop()
        self.inner: asyncio.Protocol = H11Protocol(
            config=config, server_state=server_state, app_state=app_state, _loop=self.loop
        )
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.admitted = False
        self.lingering = False
        self._head: asyncio.TimerHandle | None = None
        self._linger: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not isinstance(transport, asyncio.Transport):
            raise TypeError(f"a stream transport is needed, not {type(transport).__name__}")
        self.transport = transport
        self.peer = peer_of(transport)
        refusal = self.limiter.admit(self.peer)
        if refusal is not None:
            refuse(transport, refusal, self.limiter)
            return
        self.admitted = True
        self.inner.connection_made(_Transport(transport, self))
        self._watch_head()

    def data_received(self, data: bytes) -> None:
        if self.admitted and not self.lingering:  # else: refused or closing, discarded
            self.inner.data_received(data)
            self._watch_head()

    def eof_received(self) -> bool | None:
        if self.admitted and not self.lingering:
            return self.inner.eof_received()
        return None  # the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._head, self._linger):
            if timer is not None:
                timer.cancel()
        self._head = self._linger = None
        if self.admitted:
            self.admitted = False
            self.limiter.release(self.peer)
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.admitted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.admitted:
            self.inner.resume_writing()

    def _watch_head(self) -> None:
        """Arm the head deadline while a request head is awaited, disarm it once complete."""
        closing = self.transport is None or self.transport.is_closing() or self.lingering
        waiting = not closing and _awaiting_head(self.inner)
        if waiting and self._head is None:
            timeout = self.limiter.settings.header_timeout_s
            self._head = self.loop.call_later(timeout, self._head_late)
        elif not waiting and self._head is not None:
            self._head.cancel()
            self._head = None

    def _head_late(self) -> None:
        self._head = None
        transport = self.transport
        if transport is None or transport.is_closing() or not _awaiting_head(self.inner):
            return
        transport.write(answer(408, self.limiter.head_late(self.peer)))
        transport.close()

    def close(self) -> None:
        """uvicorn closes the connection: at once, or lingering when a body is still coming."""
        transport = self.transport
        if transport is None or transport.is_closing() or self.lingering:
            return
        if not _sending_body(self.inner):
            transport.close()
            return
        self.lingering = True
        self._watch_head()
        transport.resume_reading()  # uvicorn may have paused it (body over its high water)
        if transport.can_write_eof():
            transport.write_eof()  # the answer, then FIN: the client may read it while sending
        self._linger = self.loop.call_later(LINGER_S, transport.close)

    def swap(self, protocol: asyncio.BaseProtocol) -> None:
        """uvicorn hands the connection to another protocol (a WebSocket upgrade)."""
        if not isinstance(protocol, asyncio.Protocol):
            raise TypeError(f"a streaming protocol is needed, not {type(protocol).__name__}")
        self.inner = protocol
        self._watch_head()


class _Transport(asyncio.Transport):
    """The real transport as uvicorn's protocols see it: ``close`` and ``set_protocol``
    go through the :class:`GuardedConnection`, everything else straight through."""

    def __init__(self, real: asyncio.Transport, owner: GuardedConnection) -> None:
        super().__init__()
        self._real = real
        self._owner = owner

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._real.get_extra_info(name, default)

    def is_closing(self) -> bool:
        return self._owner.lingering or self._real.is_closing()

    def close(self) -> None:
        self._owner.close()

    def abort(self) -> None:
        self._real.abort()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._owner.swap(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._owner.inner

    def is_reading(self) -> bool:
        return self._real.is_reading()

    def pause_reading(self) -> None:
        self._real.pause_reading()

    def resume_reading(self) -> None:
        self._real.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._real.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._real.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._real.get_write_buffer_limits()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._real.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self._real.writelines(list_of_data)

    def write_eof(self) -> None:
        self._real.write_eof()

    def can_write_eof(self) -> bool:
        return self._real.can_write_eof()


class CountedServerConnection(CoalescingServerConnection):
    """The worker's WebSocket connections (websockets), counted by :attr:`limiter`: one
    over a cap is answered 503 and closed before websockets sees a byte of it. The
    request head's deadline there is websockets' ``open_timeout``."""

    limiter: ClassVar[ConnectionLimiter]
    peer = ""
    refused = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.peer = peer_of(transport)
        refusal = self.limiter.admit(self.peer)
        self.refused = refusal is not None
        if refusal is None:
            super().connection_made(transport)
        elif isinstance(transport, asyncio.Transport):
            refuse(transport, refusal, self.limiter)

    def data_received(self, data: bytes) -> None:
        if not self.refused:
            super().data_received(data)

    def eof_received(self) -> None:
        if not self.refused:
            super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.refused:
            self.refused = True
            self.limiter.release(self.peer)
            super().connection_lost(exc)


def websockets_connection(limiter: ConnectionLimiter) -> type[CountedServerConnection]:
    """The ``create_connection`` class for ``websockets.serve`` counted by ``limiter``."""
    return type("WorkerConnection", (CountedServerConnection,), {"limiter": limiter})


def uvicorn_options(limiter: ConnectionLimiter) -> dict[str, Any]:
    """``uvicorn.Config`` keyword arguments that serve through ``limiter``'s limits."""
    protocol = type("GuardedH11Connection", (GuardedConnection,), {"limiter": limiter})
    trusted = list(limiter.settings.trusted_proxies)
    return {
        "http": protocol,
        "timeout_keep_alive": limiter.settings.keep_alive_s,
        "proxy_headers": bool(trusted),
        "forwarded_allow_ips": trusted,
    }
