"""WAN latency on loopback: a TCP proxy that delays each direction, and the local provider
with every pod behind one (``tc netem`` is not available here: ../shared/design/FACTS.md).

:class:`DelayProxy` listens on 127.0.0.1 and forwards every connection to a target port;
each chunk read is written to the other side ``one_way_s`` after it was read, in order,
so a request/answer round trip takes ``2 x one_way_s`` more. Each direction holds at
most ``MAX_CHUNKS`` chunks in flight (then reading waits: TCP back-pressure).

:class:`ProxiedProvider` wraps :class:`deploy.providers.local.LocalProvider`: each
worker's tunnel and HTTP addresses are those of a proxy with its tier's delay, so the
orchestrator's probes and canaries and the ingest's tunnels all cross the "WAN".
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from deploy.models import Endpoint, PodInfo, PodSpec
from deploy.providers.local import LocalProvider

MAX_CHUNKS = 256
READ_BYTES = 1 << 16


class DelayProxy:
    """A delaying TCP proxy from 127.0.0.1:<port> to 127.0.0.1:<target>."""

    def __init__(self, target_port: int, one_way_s: float) -> None:
        self.target_port = target_port
        self.one_way_s = one_way_s
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> DelayProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(self._pump(reader, up_w), self._pump(up_r, writer))
        finally:
            for w in (writer, up_w):
                w.close()
            if task is not None:
                self._tasks.discard(task)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """Copy src to dst, each chunk ``one_way_s`` late; EOF is passed on the same way."""
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(MAX_CHUNKS)

        async def deliver() -> None:
            while True:
                at, data = await chunks.get()
                await asyncio.sleep(max(0.0, at - loop.time()))
                if not data:
                    break
                dst.write(data)
                await dst.drain()
            with contextlib.suppress(OSError):
                if dst.can_write_eof():
                    dst.write_eof()

        sender = asyncio.create_task(deliver())
        try:
            while data := await src.read(READ_BYTES):
                await chunks.put((loop.time() + self.one_way_s, data))
        except OSError:
            pass
        finally:
            await chunks.put((loop.time() + self.one_way_s, b""))
            with contextlib.suppress(OSError):
                await sender

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class ProxiedProvider:
    """The local provider, each pod's workers behind a :class:`DelayProxy` of its tier's
    one-way delay (``delays``: tier -> seconds; a tier not named gets none)."""

    def __init__(self, local: LocalProvider, delays: Mapping[str, float]) -> None:
        self.local = local
        self.delays = dict(delays)
        self.name = local.name
        self.proxies: dict[tuple[str, int], DelayProxy] = {}

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.local, attr)  # cert_names, kill, pods ...

    async def create(self, spec: PodSpec) -> PodInfo:
        return await self._proxied(await self.local.create(spec))

    async def get(self, pod_id: str) -> PodInfo | None:
        info = await self.local.get(pod_id)
        return None if info is None else await self._proxied(info)

    async def list(self) -> list[PodInfo]:
        return [await self._proxied(i) for i in await self.local.list()]

    async def stop(self, pod_id: str) -> None:
        await self.local.stop(pod_id)

    async def terminate(self, pod_id: str) -> None:
        await self.local.terminate(pod_id)

    async def prices(self) -> Any:
        return await self.local.prices()

    async def _proxied(self, info: PodInfo) -> PodInfo:
        if not info.endpoints:
            return info
        tier = self.local.pods[info.id].spec.tier
        moved = []
        for ep in info.endpoints:
            port = urlsplit(ep.tunnel_url).port or 0
            proxy = self.proxies.get((info.id, port))
            if proxy is None:
                proxy = await DelayProxy(port, self.delays.get(tier, 0.0)).start()
                self.proxies[(info.id, port)] = proxy
            there = f"127.0.0.1:{proxy.port}"
            moved.append(Endpoint(ep.tunnel_url.replace(f"127.0.0.1:{port}", there),
                                  ep.http_url.replace(f"127.0.0.1:{port}", there)))  # fmt: skip
        info.set_endpoints(tuple(moved))
        return info

    async def aclose(self) -> None:
        await self.local.aclose()
        await asyncio.gather(*(p.aclose() for p in self.proxies.values()))
