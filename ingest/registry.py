"""Every stream of the ingest, every worker tunnel, and which tunnel serves each stream.

One :class:`StreamRegistry` owns the streams; a :class:`TunnelClient` only
serves the streams the registry gives it. The default worker
(``worker_url``) is one tunnel among the others, named ``default``: streams
created without a placement start there, and the orchestrator may place any
stream on any worker (``place``), the default one included. ``create``,
``update``, ``remove`` and ``place`` all go through the registry, so an id
names one stream (one decode thread) wherever it runs.

**Moves.** ``place(stream, worker)`` detaches the stream from its tunnel first
- its sender stops, a CLOSE frees the old session, frames in flight there are
counted ``disconnected`` - and then adds it to the new tunnel with the latest
session snapshot the old worker sent, so the new worker resumes the tracker
and track ids continue. A stream is never served by two workers at once, and
its decode thread never stops. A placement naming the worker a stream is on
changes nothing; one naming a known worker at a new address moves every
stream of that worker there. A tunnel that carries no stream is stopped:
the pool's are forgotten, the default one stays listed (``IDLE``).

**Failover.** When a tunnel is unhealthy - ``STALLED`` (the worker stopped
answering heartbeats or frames, see :mod:`ingest.tunnel_health`), or not back
within the stall threshold after its connection dropped - and another tunnel
is ``UP``, the registry moves every stream of the unhealthy one there at once
(to the tunnel with the fewest streams first), with its latest snapshot, so
track ids continue; the emptied tunnel is then stopped (frames in flight
there count ``disconnected``). The default worker's streams fail over like
the others, and the default worker takes streams over when it is the one up.
Each such move counts in ``moves`` and ``failovers`` and is logged. With no
other tunnel up the streams stay ``STALLED`` and recover by themselves when
their worker answers again.

**Removal.** ``remove`` (and ``update``, which replaces a stream by a new one
in the next epoch on the same tunnel) stops the decode thread, lets the last
frames in flight come back (bounded by ``frame_timeout_s``), sends CLOSE so
the worker frees its session, and forgets the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from framerelay import wire
from framerelay.errors import ConfigError
from framerelay.results import ResultRecord
from ingest.auth import check_worker_url
from ingest.job_task import JobRuns
from ingest.resume import ResumeAt
from ingest.serverless_task import ServerlessRuns
from ingest.settings import StreamConfig
from ingest.stream import IngestStream
from ingest.tunnel_client import TunnelClient, supervise
from ingest.tunnel_health import TunnelState
from ingest.tunnel_options import TunnelOptions as TunnelOptions

log = logging.getLogger(__name__)
DEFAULT_TUNNEL = "default"
"""The name of the tunnel to the default worker (``worker_url``)."""
Snapshot = tuple[wire.SessionClock, bytes]
STOP_TIMEOUT_S = 5.0
RETIRE_GRACE_S = 2.0
JOIN_TIMEOUT_S = 5.0


class StreamExists(ConfigError):
    """A stream with this id is already running."""


class UnknownStream(ConfigError):
    """No stream has this id."""


@dataclass(frozen=True)
class _Run:
    stop: asyncio.Event
    task: asyncio.Task[None]


class StreamRegistry:
    """The streams, the tunnels (``default`` and one per placed worker) and who serves whom.

    ``token_for(worker_id)`` gives the token for a worker's tunnel; ``on_result`` hears
    every result. With ``default_url`` the registry has a default tunnel (its token is
    for ``default_worker_id``): new streams start there. Without it, a stream waits
    unserved until it is placed.
    """

    def __init__(
        self,
        token_for: Callable[[str], str],
        on_result: Callable[[ResultRecord], None],
        options: TunnelOptions | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        default_url: str | None = None,
        default_worker_id: str = "*",
        jobs: JobRuns | None = None,
        serverless: ServerlessRuns | None = None,
    ) -> None:
        self.options = options or TunnelOptions()
        self.jobs = jobs  # runs the job task of a stream whose config has one
        self.serverless = serverless  # job tasks naming an endpoint: never on a tunnel
        self._token_for = token_for
        self._on_result = on_result
        self._ssl = ssl_context
        self._streams: dict[str, IngestStream] = {}
        self._where: dict[str, str] = {}
        """Stream id -> the name of the tunnel serving it."""
        self._clients: dict[str, TunnelClient] = {}
        self._runs: dict[str, _Run] = {}
        self.moves = 0
        """Streams moved between tunnels (placements that changed a tunnel, failovers)."""
        self.failovers = 0
        """Streams moved off an unhealthy tunnel by the registry itself."""
        self._lock = asyncio.Lock()
        self._leaving: set[str] = set()
        """Streams being removed or replaced: failover leaves them where they are."""
        self._retiring: set[asyncio.Task[None]] = set()
        self._failover_due = False
        self._failing: asyncio.Task[None] | None = None
        self._stuck: set[str] = set()
        """Unhealthy tunnels whose streams had nowhere to go (logged once)."""
        self._closing = False
        self._parked: dict[str, Snapshot] = {}
        """Snapshots of unserved streams (taken over, not placed yet): resumed at placement."""
        self.default: str | None = None
        if default_url is not None:
            check_worker_url(default_url, allow_insecure=self.options.allow_insecure)
            self._clients[DEFAULT_TUNNEL] = self._new_client(
                DEFAULT_TUNNEL, default_url, None, default_worker_id
            )
            self.default = DEFAULT_TUNNEL

    # -- reading -----------------------------------------------------------------

    @property
    def streams(self) -> Mapping[str, IngestStream]:
        """Every stream, by id (read-only)."""
        return MappingProxyType(self._streams)

    @property
    def where(self) -> Mapping[str, str]:
        """Stream id -> the tunnel serving it (read-only; unserved streams absent)."""
        return MappingProxyType(self._where)

    @property
    def clients(self) -> Mapping[str, TunnelClient]:
        """Every tunnel by name: ``default`` first, then the placed workers' (read-only)."""
        return MappingProxyType(self._clients)

    def placed(self) -> dict[str, str]:
        """Streams served by a worker other than the default one: stream id -> worker id."""
        return {sid: w for sid, w in self._where.items() if w != self.default}

    def snapshot(self, stream_id: str) -> Snapshot | None:
        """The latest session snapshot the worker serving ``stream_id`` sent (None: none)."""
        client = self._clients.get(self._where.get(stream_id, ""))
        found = client.snapshots.get(stream_id) if client is not None else None
        return found if found is not None else self._parked.get(stream_id)

    def get(self, stream_id: str) -> IngestStream:
        stream = self._streams.get(stream_id)
        if stream is None:
            raise UnknownStream(f"no stream {stream_id!r}")
        return stream

    # -- changing ----------------------------------------------------------------

    def create(
        self,
        config: StreamConfig,
        *,
        first_epoch: int = 0,
        snapshot: Snapshot | None = None,
        resume: ResumeAt | None = None,
        served: bool = True,
    ) -> IngestStream:
        """Start a new stream on the default tunnel (unserved without one, or without
        ``served``, until placed), resuming ``snapshot`` and starting a file at ``resume``
        ( (a stream taken over from another ingest replica). StreamExists if the id is
        taken."""
        if config.id in self._streams:
            raise StreamExists(f"stream {config.id!r} already exists")
        worker = self.default if served else None
        return self._start(config, first_epoch, worker, snapshot, resume)

    async def update(self, config: StreamConfig) -> IngestStream:
        """Replace a stream by one with the new definition (its next epoch), on the same
        tunnel. UnknownStream if there is none."""
        old = self.get(config.id)
        close = await self._retire(old)
        async with self._lock:
            worker = self._where.get(config.id)
            await self._forget(config.id, close=close)
            stream = self._start(config, old.epoch + 1, worker)
            await self._close_idle()
        self._join_later(old)
        return stream

    async def remove(self, stream_id: str) -> IngestStream:
        """Stop a stream and forget it (its worker frees the session). UnknownStream if
        there is none."""
        stream = self.get(stream_id)
        close = await self._retire(stream)
        async with self._lock:
            await self._forget(stream_id, close=close)
            await self._close_idle()
        self._join_later(stream)
        return stream

    async def place(
        self,
        stream_id: str,
        worker_id: str,
        url: str,
        tls_server_name: str | None = None,
        config: StreamConfig | None = None,
    ) -> bool:
        """Serve ``stream_id`` by ``worker_id`` at ``url`` (its certificate checked for
        ``tls_server_name`` when given), creating it from ``config`` if it is new; False
        if nothing changed. ConfigError for a URL the ingest must not use;
        UnknownStream for a new stream without its definition."""
        check_worker_url(url, allow_insecure=self.options.allow_insecure,
                         tls_server_name=tls_server_name)  # fmt: skip
        self._check_default(worker_id, url, tls_server_name)
        async with self._lock:
            if stream_id not in self._streams:
                if config is None or config.id != stream_id:
                    raise UnknownStream(f"unknown stream {stream_id!r}: send its definition")
                self._start(config, 0, None)
            readdressed = await self._tunnel(worker_id, url, tls_server_name)
            old = self._where.get(stream_id)
            if old == worker_id:
                return readdressed
            close = not self._unhealthy(stream_id)  # no CLOSE into a stall
            snapshot = await self._detach(stream_id, close=close)
            snapshot = snapshot or self._parked.pop(stream_id, None)
            self._attach(self._streams[stream_id], worker_id, snapshot)
            self.moves += old is not None
            log.info("stream %s: %s -> %s (snapshot: %s)",
                     stream_id, old, worker_id, snapshot is not None)  # fmt: skip
            await self._close_idle()
            return True

    def _check_default(self, worker_id: str, url: str, tls_server_name: str | None) -> None:
        if worker_id != self.default:
            return
        client = self._clients[worker_id]
        if (client.url, client.server_hostname) != (url, tls_server_name):
            raise ConfigError(
                f"worker id {worker_id!r} names the ingest's default worker "
                "(FRAMERELAY_INGEST_WORKER_URL) at another address; place the stream by the "
                "worker's own id"
            )

    async def aclose(self, drain_timeout_s: float = 3.0) -> None:
        """Stop every stream and tunnel: the last results come back (bounded), then the
        tunnels close and the decode threads end. The streams stay listed."""
        self._closing = True  # no failover and no tunnel (re)started from now on
        if self._failing is not None:
            self._failing.cancel()
            await asyncio.gather(self._failing, return_exceptions=True)
        for stream in self._streams.values():
            stream.stop()
        clients = list(self._clients.values())
        await asyncio.gather(*(c.drain(drain_timeout_s) for c in clients))
        for run in self._runs.values():
            run.stop.set()
        tasks = [run.task for run in self._runs.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)
        self._runs.clear()
        joins = [asyncio.to_thread(s.join, JOIN_TIMEOUT_S) for s in self._streams.values()]
        await asyncio.gather(*joins)
        if self._retiring:
            await asyncio.wait(set(self._retiring), timeout=JOIN_TIMEOUT_S)

    # -- streams on tunnels --------------------------------------------------------

    def _start(
        self,
        config: StreamConfig,
        first_epoch: int,
        worker: str | None,
        snapshot: Snapshot | None = None,
        resume: ResumeAt | None = None,
    ) -> IngestStream:
        stream = IngestStream(
            config,
            asyncio.get_running_loop(),
            self.options.max_inflight,
            link_up=functools.partial(self._link_up, config.id),
            first_epoch=first_epoch,
            resume=resume,
        )
        if config.job is not None:  # before launch: the task decides where reading starts
            if self.jobs is None:
                raise ConfigError(f"stream {config.id!r} is a job task: this ingest runs none")
            self.jobs.attach(stream)
        self._streams[config.id] = stream
        if self.serverless is not None and self.serverless.serves(config):
            self.serverless.start(stream)
        elif worker is not None and worker in self._clients:
            self._attach(stream, worker, snapshot)
        elif snapshot is not None:
            self._parked[config.id] = snapshot
        stream.launch()
        return stream

    def _link_up(self, stream_id: str) -> bool:
        client = self._clients.get(self._where.get(stream_id, ""))
        return client is not None and client.connected.is_set()

    def _attach(self, stream: IngestStream, worker: str, snapshot: Snapshot | None) -> None:
        """Serve ``stream`` by the tunnel ``worker`` (resuming ``snapshot``)."""
        if self.serverless is not None and self.serverless.serves(stream.config):
            return  # its serverless endpoint serves it (ingest.serverless_task)
        client = self._clients[worker]
        self._where[stream.id] = worker
        client.add(stream, snapshot=snapshot)
        self._ensure_running(worker)
        if client.unhealthy:  # e.g. a worker that went away: let failover find another
            self._failover_soon()

    async def _detach(self, stream_id: str, *, close: bool) -> Snapshot | None:
        """Take ``stream_id`` off its tunnel (CLOSE to the worker if ``close``); its latest
        session snapshot."""
        worker = self._where.pop(stream_id, None)
        client = self._clients.get(worker) if worker is not None else None
        if client is None:
            return None
        detached = await client.detach(stream_id, close=close)
        return detached[1] if detached is not None else None

    async def _retire(self, stream: IngestStream) -> bool:
        """Stop ``stream`` and wait (bounded) for its sender to get the last results and
        send CLOSE. True if a CLOSE is still due (none is sent into an unhealthy tunnel,
        and no last result awaited from it)."""
        self._leaving.add(stream.id)
        stream.stop()
        if self._unhealthy(stream.id):
            return False
        await asyncio.sleep(0)  # a sender spawned just now starts (and sees the closed slot)
        try:
            async with asyncio.timeout(self.options.frame_timeout_s + RETIRE_GRACE_S):
                await stream.sender_idle.wait()
        except TimeoutError:
            log.warning("stream %s: sender still busy after removal; dropping it", stream.id)
            return not self._unhealthy(stream.id)
        return False

    def _unhealthy(self, stream_id: str) -> bool:
        client = self._clients.get(self._where.get(stream_id, ""))
        return client is not None and client.unhealthy

    async def _forget(self, stream_id: str, *, close: bool) -> None:
        self._parked.pop(stream_id, None)
        await self._detach(stream_id, close=close)
        self._streams.pop(stream_id, None)
        self._leaving.discard(stream_id)

    def _join_later(self, stream: IngestStream) -> None:
        """The decode thread ends by itself (within a read timeout); do not hold the API."""
        if stream.alive:
            task = asyncio.create_task(asyncio.to_thread(stream.join, JOIN_TIMEOUT_S * 4))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    # -- tunnels -------------------------------------------------------------------

    def _new_client(self, name: str, url: str, server_name: str | None, token_id: str
                    ) -> TunnelClient:  # fmt: skip
        secure = url.startswith("wss://")
        if secure and self._ssl is None:
            self._ssl = ssl.create_default_context()
        o = self.options
        return TunnelClient(
            url,
            functools.partial(self._token_for, token_id),
            self._on_result,
            ssl_context=self._ssl if secure else None,
            server_hostname=server_name,
            frame_timeout_s=o.frame_timeout_s,
            reconnect_max_s=o.reconnect_max_s,
            heartbeat_interval_s=o.heartbeat_interval_s,
            stall_after_s=o.stall_after_s,
            on_state=functools.partial(self._tunnel_changed, name),
        )

    async def _tunnel(self, name: str, url: str, server_name: str | None) -> bool:
        """Make sure the tunnel ``name`` goes to ``url``; a tunnel of that name to another
        address is replaced and its streams move along. True if streams moved."""
        old = self._clients.get(name)
        if old is not None and (old.url, old.server_hostname) == (url, server_name):
            return False
        self._clients[name] = fresh = self._new_client(name, url, server_name, name)
        if old is None:
            return False
        moving = sorted(s for s, w in self._where.items() if w == name)
        for sid in moving:
            detached = await old.detach(sid)
            fresh.add(self._streams[sid], snapshot=detached[1] if detached else None)
        await self._stop_run(name)
        if moving:
            self._ensure_running(name)
        self.moves += len(moving)
        log.info("worker %s moved to %s: %s", name, url, ", ".join(moving) or "no streams")
        return bool(moving)

    def _ensure_running(self, name: str) -> None:
        if name not in self._runs and not self._closing:
            stop = asyncio.Event()
            task = asyncio.create_task(supervise(self._clients[name], stop), name=f"tunnel-{name}")
            self._runs[name] = _Run(stop, task)

    async def _stop_run(self, name: str) -> None:
        run = self._runs.pop(name, None)
        if run is not None:
            run.stop.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(run.task), STOP_TIMEOUT_S)

    async def _close_idle(self) -> None:
        """Stop tunnels that serve no stream (e.g. to a dead worker); the default one stays
        listed."""
        busy = set(self._where.values())
        for name in [n for n in self._clients if n not in busy]:
            await self._stop_run(name)
            if name != self.default:
                del self._clients[name]

    # -- failover ------------------------------------------------------------------

    def _tunnel_changed(self, name: str, client: TunnelClient) -> None:
        """A tunnel's state changed: fail streams over if one is unhealthy and one is up."""
        if self._clients.get(name) is not client:
            return
        if not client.unhealthy:
            self._stuck.discard(name)
        if any(c.unhealthy for c in self._clients.values()):
            self._failover_soon()

    def _failover_soon(self) -> None:
        if self._closing:
            return
        self._failover_due = True
        if self._failing is None or self._failing.done():
            self._failing = asyncio.create_task(self._fail_over(), name="tunnel-failover")

    async def _fail_over(self) -> None:
        while self._failover_due:
            self._failover_due = False
            try:
                async with self._lock:
                    for name, client in list(self._clients.items()):
                        if client.unhealthy and self._clients.get(name) is client:
                            await self._evacuate(name, client)
                    await self._close_idle()
            except Exception:  # a bug here must not end failover for good
                log.exception("failover failed; trying again at the next tunnel change")

    async def _evacuate(self, name: str, client: TunnelClient) -> None:
        """Move every stream of the unhealthy tunnel ``name`` to tunnels that are up."""
        moved: list[str] = []
        for stream_id in sorted(s for s, w in self._where.items() if w == name):
            target = self._healthy_target(exclude=name)
            if target is None:
                break
            if stream_id in self._leaving or self._where.get(stream_id) != name:
                continue
            snapshot = await self._detach(stream_id, close=False)  # no CLOSE into a stall
            self._attach(self._streams[stream_id], target, snapshot)
            self.moves += 1
            self.failovers += 1
            moved.append(f"{stream_id} -> {target}")
        if moved:
            log.warning("worker %s unhealthy (%s): failed over %s",
                        name, client.stall_reason, ", ".join(moved))  # fmt: skip
        elif name in self._where.values() and name not in self._stuck:
            self._stuck.add(name)
            log.warning("worker %s unhealthy (%s) and no other worker is up: its streams wait",
                        name, client.stall_reason)  # fmt: skip

    def _healthy_target(self, exclude: str) -> str | None:
        """The tunnel that is UP with the fewest streams (None if none is up)."""
        load = {n: 0 for n, c in self._clients.items()
                if n != exclude and c.state is TunnelState.UP}  # fmt: skip
        if not load:
            return None
        for worker in self._where.values():
            if worker in load:
                load[worker] += 1
        return min(load, key=lambda n: (load[n], n))
