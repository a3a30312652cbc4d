"""A raw HTTP/1.1 client on asyncio streams: exact headers, chunked bodies, no client
limits, and bodies still sent after the server answered (what a hostile client does)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

CHUNK = 65_536


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def head(method: str, path: str, *, token: str | None = None, length: int | None = None,
         chunked: bool = False, content_type: str = "application/json") -> bytes:  # fmt: skip
    """The request line and headers (``length``: Content-Length; ``chunked``: no length)."""
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Type: {content_type}"]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunked(data: bytes, size: int = CHUNK) -> Iterator[bytes]:
    """``data`` in the chunked transfer coding, ``size`` bytes a chunk, then the last chunk."""
    for i in range(0, len(data), size):
        part = data[i : i + size]
        yield f"{len(part):x}\r\n".encode() + part + b"\r\n"
    yield b"0\r\n\r\n"


def plain(data: bytes, size: int = CHUNK) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)
    }
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Answer(status, headers, body)


class Connection:
    """One keep-alive connection to ``127.0.0.1:port``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.sent = 0

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        return cls(reader, writer)

    async def send(self, parts: Iterable[bytes]) -> bool:
        """Write every part; False when the server closed or reset the connection first."""
        try:
            for part in parts:
                self.writer.write(part)
                await self.writer.drain()
                self.sent += len(part)
        except (ConnectionError, OSError):
            return False
        return True

    async def answer(self, timeout_s: float = 10.0) -> Answer:
        async with asyncio.timeout(timeout_s):
            return await read_answer(self.reader)

    async def exchange(self, head_: bytes, body: Iterable[bytes] = (), timeout_s: float = 10.0,
                       ) -> Answer:  # fmt: skip
        """Send the request (all of its body, even after an early answer) and read the answer."""
        sender = asyncio.create_task(self.send(itertools.chain([head_], body)))
        try:
            return await self.answer(timeout_s)
        finally:
            await asyncio.wait_for(sender, timeout_s)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


@contextlib.asynccontextmanager
async def connection(port: int) -> AsyncIterator[Connection]:
    conn = await Connection.open(port)
    try:
        yield conn
    finally:
        await conn.close()
