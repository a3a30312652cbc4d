"""One writer per tunnel connection: messages in order, as many per write as are waiting.

``websockets`` writes every message with its own ``send`` system call. On a
tunnel that is most of the cost of a message: on loopback one ``send`` of a
238-byte RESULT costs about as much CPU as decoding and checking its header
(``bench/tunnel.py``), and each one wakes the peer. Messages come in bursts
(a batch of results at once; the credits they return release as many frames
at once), so the tunnel writes them together:

* :class:`Outbox` takes messages without waiting (:meth:`Outbox.put`,
  bounded: the protocol's credits bound what can be waiting) and a writer
  task (:meth:`Outbox.run`) sends everything waiting, in order, in one write.
  Each message stays its own WebSocket message; only the ``write`` is shared.
  A message put while nothing is being written and the peer reads is written
  at once instead: waking the writer task costs a turn of the event loop per
  message, which in a round trip with few frames in flight was most of the
  tunnel's own cost (``bench/tunnel.py``). Inside :func:`corked` (the worker
  delivering a batch's results) puts only queue, and each outbox that got
  messages writes them all at once, in one write, when the block ends. The
  writer task remains for what cannot go at once: a peer that does not read
  (flow control), a plain connection, messages put during a write.
* :class:`CoalescingServerConnection` and :class:`CoalescingClientConnection`
  (give them to ``serve``/``connect`` as ``create_connection``) add
  :meth:`Coalescing.send_batch`: several messages framed by the connection's
  own protocol object, then one ``transport.write`` and the usual flow control.

A connection of another class still works with an :class:`Outbox` (one
``send`` per message), so a canary or a test can use a plain connection.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.server import ServerConnection
from websockets.protocol import State

MAX_BATCH = 64
"""At most this many messages in one write."""
MAX_BATCH_BYTES = 1 << 20
"""A batch stops growing past this many bytes (one JPEG frame is tens of KB)."""
JOIN_BELOW = 16 * 1024
"""Messages smaller than this share a write; a larger one (a FRAME's JPEG) is written
alone: on loopback, copying 37 KB into a joined buffer cost more CPU (about 3 us a
frame, ``bench/tunnel.py``) than the write it saved."""


class Coalescing:
    """Mixin for a ``websockets`` asyncio connection: :meth:`send_batch`, and every
    pending write joined into one ``transport.write``.

    It relies on two methods of ``websockets.asyncio.connection.Connection``
    (``send_context``, ``send_data``), present since the asyncio implementation
    (websockets 13); ``tests/framerelay/test_outbox.py`` pins the behaviour.
    """

    protocol: Any
    transport: Any
    paused: bool

    def write_now(self, messages: Sequence[bytes]) -> bool:
        """Send each of ``messages`` as one binary message now, in one write, without
        waiting, if the connection is open and its peer reads (flow control not
        engaged); False (nothing sent) if not."""
        if self.protocol.state is not State.OPEN or self.paused or self.transport.is_closing():
            return False
        for data in messages:
            self.protocol.send_binary(data)
        self.send_data()
        return True

    async def send_batch(self, messages: Sequence[bytes]) -> None:
        """Send each of ``messages`` as one binary message, all in one write."""
        async with self.send_context():  # type: ignore[attr-defined]
            for data in messages:
                self.protocol.send_binary(data)

    def send_data(self) -> None:
        """Write what the protocol has to send: one write when it is only data. The
        opening handshake (and anything outside OPEN) is written by websockets itself."""
        if self.protocol.state is not State.OPEN:
            super().send_data()  # type: ignore[misc]
            return
        chunks: list[bytes] = self.protocol.data_to_send()
        if len(chunks) > 1 and all(chunks):
            self._write_joined(chunks)
            return
        self._send_chunks(chunks)

    def _write_joined(self, chunks: list[bytes]) -> None:
        """Small chunks joined into one write; a chunk of :data:`JOIN_BELOW` bytes or
        more written alone (copying it would cost more than its own write)."""
        small: list[bytes] = []
        for data in chunks:
            if len(data) < JOIN_BELOW:
                small.append(data)
                continue
            if small:
                self.transport.write(b"".join(small))
                small = []
            self.transport.write(data)
        if small:
            self.transport.write(b"".join(small))

    def _send_chunks(self, chunks: list[bytes]) -> None:
        """``websockets``' own behaviour: an empty chunk is the end of the stream."""
        for data in chunks:
            if data:
                self.transport.write(data)
            elif self.transport.can_write_eof():
                try:
                    self.transport.write_eof()
                except Exception:  # noqa: S110 - as websockets: uvloop may raise here
                    pass
            else:
                self.transport.close()


class CoalescingServerConnection(Coalescing, ServerConnection):
    """A server connection with :meth:`Coalescing.send_batch`."""


class CoalescingClientConnection(Coalescing, ClientConnection):
    """A client connection with :meth:`Coalescing.send_batch`."""


_CORK: contextvars.ContextVar[set[Outbox] | None] = contextvars.ContextVar(
    "framerelay_outbox_cork", default=None
)


@contextlib.contextmanager
def corked() -> Iterator[None]:
    """Within the block, :meth:`Outbox.put` only queues; at its end every outbox that got
    messages writes them at once (one write each where the peer reads). For a burst of
    messages made in one go (a batch's results), so they share a write."""
    if _CORK.get() is not None:  # nested: the outer block writes
        yield
        return
    token = _CORK.set(set())
    try:
        yield
    finally:
        pending = _CORK.get() or set()
        _CORK.reset(token)
        for outbox in pending:
            outbox.kick()


class OutboxFull(ConnectionError):
    """More messages are waiting than the outbox holds: the peer does not read."""


class Outbox:
    """The messages waiting for one connection, written in order by :meth:`run`."""

    def __init__(
        self,
        ws: ServerConnection | ClientConnection,
        capacity: int,
        *,
        max_batch: int = MAX_BATCH,
        max_batch_bytes: int = MAX_BATCH_BYTES,
    ) -> None:
        if capacity < 1 or max_batch < 1:
            raise ValueError(f"need capacity, max_batch >= 1, got {capacity}, {max_batch}")
        self.ws = ws
        self.capacity = capacity
        self.max_batch = max_batch
        self.max_batch_bytes = max_batch_bytes
        self.writes = 0
        """Writes so far (``messages / writes``: how much was joined)."""
        self.messages = 0
        self._waiting: collections.deque[bytes] = collections.deque()
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        """Set while nothing waits and nothing is being written."""
        self._idle.set()
        self._closed = False
        self._writing = False
        """The writer task is in a write: a put waits behind it (order)."""

    def __len__(self) -> int:
        return len(self._waiting)

    def put(self, data: bytes) -> None:
        """Queue ``data`` behind what is waiting; raises :class:`OutboxFull` when the
        outbox holds ``capacity`` messages, :class:`ConnectionError` once closed."""
        if self._closed:
            raise ConnectionError("the connection's writer has stopped")
        if len(self._waiting) >= self.capacity:
            raise OutboxFull(f"{len(self._waiting)} messages wait for a peer that does not read")
        self._waiting.append(data)
        self._idle.clear()
        cork = _CORK.get()
        if cork is not None:
            cork.add(self)
            return
        self.kick()

    def kick(self) -> None:
        """Write what waits at once if nothing is being written and the peer reads, or
        wake the writer task to write it."""
        if not self._waiting:
            return
        if self._writing or self._closed or not self._write_now():
            self._ready.set()

    def try_put(self, data: bytes) -> bool:
        """:meth:`put`, False instead of raising."""
        try:
            self.put(data)
        except ConnectionError:
            return False
        return True

    async def run(self, send_timeout_s: float) -> None:
        """Write until cancelled: each time, everything waiting (up to ``max_batch``
        messages or ``max_batch_bytes``) in one write. Raises ``TimeoutError`` when a
        write (with the peer's flow control) takes over ``send_timeout_s``, and what
        the connection raises when it is closed."""
        try:
            while True:
                await self._ready.wait()
                if not self._waiting:  # written at once since it was woken
                    self._ready.clear()
                    continue
                batch = self._take()
                if not self._waiting:
                    self._ready.clear()
                self._writing = True
                try:
                    async with asyncio.timeout(send_timeout_s):
                        await self._write(batch)
                finally:
                    self._writing = False
                if not self._waiting:
                    self._idle.set()
        finally:
            self._closed = True

    async def flush(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until everything put so far is written; True if
        it was (e.g. the last CLOSE messages before a graceful shutdown)."""
        if self._closed:
            return not self._waiting
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def _write_now(self) -> bool:
        """Everything waiting, written now (on a coalescing connection whose peer reads),
        in batches as :meth:`run` would; False when some is left for the writer task."""
        if not isinstance(self.ws, Coalescing):
            return False
        while self._waiting:
            batch = self._take()
            if not self.ws.write_now(batch):
                self._waiting.extendleft(reversed(batch))
                return False
            self.writes += 1
            self.messages += len(batch)
        self._idle.set()
        return True

    def _take(self) -> list[bytes]:
        batch = [self._waiting.popleft()]
        size = len(batch[0])
        while self._waiting and len(batch) < self.max_batch and size < self.max_batch_bytes:
            data = self._waiting.popleft()
            batch.append(data)
            size += len(data)
        return batch

    async def _write(self, batch: list[bytes]) -> None:
        self.writes += 1
        self.messages += len(batch)
        if isinstance(self.ws, Coalescing):
            await self.ws.send_batch(batch)
            return
        for data in batch:
            await self.ws.send(data)
