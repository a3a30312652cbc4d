"""The tunnel's writer (framerelay.outbox) over real loopback WebSockets.

Every message stays its own WebSocket message, in order; what waits together goes
out in one ``transport.write``; a peer that does not read is cut off in time; the
closing handshake still works on a coalescing connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus
from typing import Any, cast

import pytest
import trustme
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.http11 import Request, Response

from framerelay.outbox import (
    JOIN_BELOW,
    CoalescingClientConnection,
    CoalescingServerConnection,
    Outbox,
    OutboxFull,
    corked,
)

Handler = Callable[[ServerConnection], Awaitable[None]]


@contextlib.asynccontextmanager
async def server(handler: Handler, coalescing: bool = True) -> AsyncIterator[str]:
    cls = CoalescingServerConnection if coalescing else ServerConnection
    async with serve(handler, "127.0.0.1", 0, compression=None, create_connection=cls,
                     close_timeout=0.5) as srv:  # fmt: skip
        port = next(iter(srv.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}/"


async def collect(ws: ServerConnection, into: list[bytes], n: int, done: asyncio.Event) -> None:
    with contextlib.suppress(ConnectionClosed):
        async for data in ws:
            into.append(data if isinstance(data, bytes) else data.encode())
            if len(into) >= n:
                done.set()


def count_writes(ws: ClientConnection) -> list[int]:
    """Wrap the transport's ``write``: the sizes of the writes made from now on."""
    sizes: list[int] = []
    transport: Any = ws.transport
    write = transport.write

    def counting(data: bytes) -> None:
        sizes.append(len(data))
        write(data)

    transport.write = counting
    return sizes


def messages(n: int, size: int = 1000) -> list[bytes]:
    return [i.to_bytes(4, "big") + bytes([i % 251]) * size for i in range(n)]


async def test_a_batch_is_one_write_of_separate_messages_in_order() -> None:
    got: list[bytes] = []
    done = asyncio.Event()
    async with server(lambda ws: collect(ws, got, 20, done)) as url:
        async with connect(
            url, compression=None, create_connection=CoalescingClientConnection
        ) as ws:
            assert isinstance(ws, CoalescingClientConnection)
            sizes = count_writes(ws)
            await ws.send_batch(messages(20))
            writes = list(sizes)  # (the close frame is written later)
            await asyncio.wait_for(done.wait(), 10)
    assert got == messages(20)
    assert len(writes) == 1  # 20 messages, one write (websockets alone: 20)
    assert writes[0] == sum(len(m) for m in messages(20)) + 20 * (4 + 4)  # header + mask


async def test_large_messages_are_written_alone_between_joined_small_ones_in_order() -> None:
    big = JOIN_BELOW + 100
    batch = [*messages(3, 100), *messages(2, big), *messages(4, 100)]

    got: list[bytes] = []
    done = asyncio.Event()
    async with server(lambda ws: collect(ws, got, len(batch), done)) as url:
        async with connect(
            url, compression=None, max_size=None, create_connection=CoalescingClientConnection
        ) as conn:
            ws = cast(CoalescingClientConnection, conn)
            sizes = count_writes(ws)
            await ws.send_batch(batch)
            writes = list(sizes)
            await asyncio.wait_for(done.wait(), 10)
    assert got == batch
    framed = [len(m) + (2 if len(m) < 126 else 4) + 4 for m in batch]  # header + mask
    assert writes == [sum(framed[:3]), framed[3], framed[4], sum(framed[5:])]


async def test_what_waits_together_goes_out_together_and_later_puts_follow_in_order() -> None:
    got: list[bytes] = []
    done = asyncio.Event()
    async with server(lambda ws: collect(ws, got, 30, done)) as url:
        async with connect(
            url, compression=None, create_connection=CoalescingClientConnection
        ) as ws:
            out = Outbox(ws, capacity=100)
            batch = messages(30)
            with corked():  # put in one go: one write, at the end of the block
                for data in batch[:10]:
                    out.put(data)
                assert len(out) == 10
            writer = asyncio.create_task(out.run(send_timeout_s=10))
            await asyncio.sleep(0.05)
            with corked():
                for data in batch[10:]:
                    out.put(data)
            assert await out.flush(10)
            await asyncio.wait_for(done.wait(), 10)
            writer.cancel()
    assert got == messages(30)
    assert out.messages == 30
    assert out.writes == 2  # the first ten together, then the twenty put in one go


async def test_a_message_put_while_nothing_is_written_goes_at_once_and_order_holds() -> None:
    """Put while no write is in progress and the peer reads, a message is written at once,
    with no writer task (a turn of the event loop saved per message); put while the
    writer is busy (the peer's flow control), it waits its turn behind what waits."""

    got: list[bytes] = []
    done = asyncio.Event()
    big = messages(3, size=JOIN_BELOW)
    small = messages(3)
    sent = [big[0], small[0], big[1], small[1], big[2], small[2]]
    async with server(lambda ws: collect(ws, got, len(sent), done)) as url:
        async with connect(
            url, compression=None, max_size=None, create_connection=CoalescingClientConnection
        ) as ws:
            out = Outbox(ws, capacity=10)
            out.put(big[0])  # no writer task at all: written now
            out.put(small[0])
            assert len(out) == 0 and out.writes == 2
            ws.pause_writing()  # as the transport does when the peer stops reading
            out.put(big[1])
            out.put(small[1])
            assert len(out) == 2  # left for the writer
            writer = asyncio.create_task(out.run(send_timeout_s=10))
            await asyncio.sleep(0.05)
            out.put(big[2])  # the writer waits on flow control: behind it
            ws.resume_writing()
            assert await out.flush(10)
            out.put(small[2])  # idle again: at once
            assert len(out) == 0
            await asyncio.wait_for(done.wait(), 10)
            writer.cancel()
    assert got == sent
    assert out.messages == 6


async def test_puts_inside_corked_share_one_write_per_outbox_at_its_end() -> None:
    got: list[bytes] = []
    done = asyncio.Event()
    async with server(lambda ws: collect(ws, got, 8, done)) as url:
        async with connect(
            url, compression=None, create_connection=CoalescingClientConnection
        ) as ws:
            out = Outbox(ws, capacity=10)
            sizes = count_writes(ws)
            with corked():
                for data in messages(4):
                    out.put(data)
                with corked():  # nested: the outer block writes
                    for data in messages(8)[4:]:
                        out.put(data)
                assert len(out) == 8 and not sizes
            writes = list(sizes)
            await asyncio.wait_for(done.wait(), 10)
    sent = messages(8)
    assert got == sent
    assert len(writes) == 1 and out.writes == 1 and out.messages == 8


async def test_a_batch_stops_growing_at_its_byte_bound() -> None:
    got: list[bytes] = []
    done = asyncio.Event()
    async with server(lambda ws: collect(ws, got, 10, done)) as url:
        async with connect(
            url, compression=None, create_connection=CoalescingClientConnection
        ) as ws:
            out = Outbox(ws, capacity=100, max_batch_bytes=3000)
            with corked():
                for data in messages(10):  # 1004 B each: three per write
                    out.put(data)
            writer = asyncio.create_task(out.run(send_timeout_s=10))
            assert await out.flush(10)
            await asyncio.wait_for(done.wait(), 10)
            writer.cancel()
    assert got == messages(10)
    assert out.writes == 4


async def test_a_plain_connection_works_one_send_per_message() -> None:
    got: list[bytes] = []
    done = asyncio.Event()
    async with server(lambda ws: collect(ws, got, 5, done), coalescing=False) as url:
        async with connect(url, compression=None) as ws:
            out = Outbox(ws, capacity=10)
            for data in messages(5):
                out.put(data)
            writer = asyncio.create_task(out.run(send_timeout_s=10))
            await asyncio.wait_for(done.wait(), 10)
            writer.cancel()
    assert got == messages(5)


async def test_a_full_outbox_refuses_and_a_stopped_one_says_so() -> None:
    async with server(lambda ws: ws.wait_closed()) as url:
        async with connect(url, create_connection=CoalescingClientConnection) as ws:
            out = Outbox(ws, capacity=2)
            with corked():  # they wait until the block ends
                out.put(b"a")
                out.put(b"b")
                with pytest.raises(OutboxFull, match="2 messages wait"):
                    out.put(b"c")
                assert not out.try_put(b"c")
            writer = asyncio.create_task(out.run(send_timeout_s=10))
            assert await out.flush(10)  # (written when the block ended)
            await asyncio.sleep(0.01)  # the writer runs, then stops
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            with pytest.raises(ConnectionError, match="writer has stopped"):
                out.put(b"d")


async def test_a_peer_that_does_not_read_is_cut_off_after_the_send_timeout() -> None:
    async def stalled(ws: ServerConnection) -> None:
        ws.transport.pause_reading()  # TCP fills: the writer's flow control waits
        await ws.wait_closed()

    async with server(stalled) as url:
        async with connect(
            url, compression=None, max_size=None, create_connection=CoalescingClientConnection
        ) as ws:
            out = Outbox(ws, capacity=1000)
            for data in messages(200, size=100_000):  # 20 MB: more than the buffers hold
                out.put(data)
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(TimeoutError):
                await out.run(send_timeout_s=0.5)
            assert not await out.flush(0.1)  # stopped with messages left
            ws.transport.abort()
            took = loop.time() - started
    assert took < 5


async def test_the_closing_handshake_works_on_coalescing_connections() -> None:
    closed: list[tuple[int | None, str | None]] = []

    async def handler(ws: ServerConnection) -> None:
        await ws.wait_closed()
        closed.append((ws.close_code, ws.close_reason))

    async with server(handler) as url:
        async with connect(url, create_connection=CoalescingClientConnection) as conn:
            ws = cast(CoalescingClientConnection, conn)
            await ws.send_batch([b"x", b"y"])
            await ws.close(4000, "done here")
        for _ in range(100):
            if closed:
                break
            await asyncio.sleep(0.02)
    assert closed[0] == (4000, "done here")


async def test_a_tls_refusal_on_a_coalescing_server_is_always_an_http_answer() -> None:
    """Regression (issue 12): a ``wss`` refusal seemed to close silently now and then.
    The cause was the test's sync client (its reader thread and the opening request on
    one SSL socket); over the asyncio client every refusal is answered."""
    ca = trustme.CA()
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("localhost").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)

    def refuse(conn: ServerConnection, request: Request) -> Response:
        return conn.respond(HTTPStatus.UNAUTHORIZED, "bad token\n")

    statuses: list[int] = []
    async with serve(
        ws_never,
        "127.0.0.1",
        0,
        ssl=server_ctx,
        process_request=refuse,
        create_connection=CoalescingServerConnection,
    ) as srv:
        port = next(iter(srv.sockets)).getsockname()[1]
        for _ in range(100):
            with pytest.raises(InvalidStatus) as refused:
                async with connect(
                    f"wss://localhost:{port}/", ssl=client_ctx, open_timeout=10, proxy=None
                ):
                    pass
            statuses.append(refused.value.response.status_code)
    assert statuses == [401] * 100


async def ws_never(ws: ServerConnection) -> None:
    raise AssertionError("a refused handshake never reaches the handler")
