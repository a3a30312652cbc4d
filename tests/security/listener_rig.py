"""The ingest and orchestrator APIs as real processes, and the clients that test their
listeners: slow-header clients from chosen loopback addresses (any 127.x.y.z is this
host), timed requests, raw requests whose body is still being sent."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import TIMEOUT_FACTOR
from tests.security.procs import Service, ready_line, redis_prefix, spawn, wait_healthy
from tests.support.servers import free_port

PARTIAL_HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
"""A request head that never ends."""


@dataclass
class Api:
    """A running service: its process, base URL and the secret its tokens are signed with."""

    kind: str
    service: Service
    base: str
    secret: str

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])

    @property
    def prefix(self) -> str:
        return "FRAMERELAY_INGEST_" if self.kind == "ingest" else "FRAMERELAY_ORCH_"


@contextlib.contextmanager
def api_process(kind: str, folder: Path, env: dict[str, str]) -> Iterator[Api]:
    """``framerelay ingest`` or ``framerelay orchestrator`` (no worker, no streams) with
    ``env`` on top of what it needs; stopped afterwards."""
    secret = secrets.token_urlsafe(32)
    base_env = {"FRAMERELAY_TOKEN_SECRETS": secret}
    with redis_prefix(f"listen-{kind}") as prefix:
        if kind == "ingest":
            # port 0: the port it binds is read from its ready line (a free port picked here
            # could be taken by another test process before the ingest binds it)
            args = [
                "ingest",
                "--api-port",
                "0",
                "--worker-url",
                f"ws://127.0.0.1:{free_port()}/v1/tunnel",
            ]
            base_env["FRAMERELAY_INGEST_STORE_PATH"] = str(folder / f"streams-{prefix}.json")
        else:
            args = ["orchestrator", "--port", "0"]
            base_env["FRAMERELAY_ORCH_KEY_PREFIX"] = prefix
            base_env["FRAMERELAY_ORCH_TIERS"] = json.dumps([{"name": "ondemand", "max_workers": 0}])
        svc = spawn(f"{kind}-{time.monotonic_ns()}", args, {**base_env, **env}, folder)
        try:
            base = _listening(svc, "ingest API") if kind == "ingest" else ready_line(svc)["url"]
            wait_healthy(svc, base)
            yield Api(kind, svc, base, secret)
        finally:
            svc.stop()


def _listening(svc: Service, what: str, timeout_s: float = 30.0) -> str:
    """The URL a service's ready line says ``<what> listening on <url>; ...``."""
    said = f"{what} listening on "
    deadline = time.monotonic() + timeout_s * TIMEOUT_FACTOR
    while time.monotonic() < deadline and svc.proc.poll() is None:
        for line in svc.output().splitlines():
            if said in line:
                return line.split(said, 1)[1].split(";", 1)[0].strip()
        time.sleep(0.05)
    raise RuntimeError(f"{svc.name} did not say where it listens: {svc.output()[-2000:]}")


async def closed(writer: asyncio.StreamWriter) -> None:
    """Close a client connection and wait until it is (none left for the loop's end)."""
    writer.close()
    with contextlib.suppress(ConnectionError, OSError):
        await writer.wait_closed()


@dataclass
class Slow:
    """One slow-header client: when it connected, when the server closed it, what it said."""

    source: str
    started: float = 0.0
    """When it began to connect (the server's clock for it cannot have started before)."""
    opened: float = 0.0
    """When its connect returned (the server's clock for it had started by then)."""
    closed: float = 0.0
    said: bytes = b""

    @property
    def held_s(self) -> float:
        """How long the server held it, at most (from its connect returning to the close:
        on a busy event loop the connect may return well after the server accepted)."""
        return self.closed - self.opened

    @property
    def held_at_least_s(self) -> float:
        """How long the server held it, at least (from before its connect began)."""
        return self.closed - self.started

    @property
    def status(self) -> int:
        parts = self.said.split(b" ", 2)
        return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


async def slow_client(port: int, source: str, sent: asyncio.Event, limit_s: float) -> Slow:
    """Connect from ``source``, send half a request head, read until the server closes
    (at most ``limit_s``); ``sent`` is set once the half head is written."""
    slow = Slow(source, started=time.monotonic())
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    finally:
        slow.opened = time.monotonic()
        sent.set()
    try:
        writer.write(PARTIAL_HEAD)
        await writer.drain()
        async with asyncio.timeout(limit_s):
            slow.said = await reader.read()
    except (ConnectionError, TimeoutError):
        pass
    finally:
        slow.closed = time.monotonic()
        await closed(writer)
    return slow


async def slow_clients(port: int, sources: list[str], limit_s: float) -> list[asyncio.Task[Slow]]:
    """One slow client per entry of ``sources``; returns once each wrote its half head
    (or ended)."""
    events = [asyncio.Event() for _ in sources]
    tasks = [
        asyncio.create_task(slow_client(port, src, ev, limit_s))
        for src, ev in zip(sources, events, strict=True)
    ]
    async with asyncio.timeout(30 * TIMEOUT_FACTOR):
        for ev in events:
            await ev.wait()
    return tasks


async def timed_get(port: int, path: str = "/healthz") -> tuple[int, float]:
    """A new connection's GET from 127.0.0.1 (a bare client: the figure is the server's):
    status and seconds."""
    t0 = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
        )
        async with asyncio.timeout(30 * TIMEOUT_FACTOR):
            said = await reader.read()
    finally:
        await closed(writer)
    took = time.monotonic() - t0
    parts = said.split(b" ", 2)
    return (int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0), took
