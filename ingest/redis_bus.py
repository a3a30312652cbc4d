"""Results in Redis: live PUBLISH, durable Streams, and a consumer-group reader.

Keys (``prefix`` defaults to ``framerelay``):

* ``<prefix>:live:<stream_id>`` - pub/sub channel; each message is a result's
  JSON. Fire and forget: subscribers that are away miss results.
* ``<prefix>:results:<stream_id>`` - Redis Stream; entry id = the result's
  durable id, field ``r`` = its JSON. Trimmed to about ``maxlen`` entries
  (``XADD MAXLEN ~``) and to ``retention_s`` (``XTRIM MINID ~``, plus an
  expiry so an abandoned stream disappears).

:class:`RedisPublisher` never blocks the caller: ``offer`` appends to a bounded
buffer (oldest dropped and counted when Redis is slow or down) and a task
drains it in pipelined batches, reconnecting with backoff. Explicit entry ids
make retries idempotent. :class:`ResultConsumer` reads a stream through a
consumer group at least once: its own pending entries first (after a
restart), stale entries of dead consumers (``XAUTOCLAIM``), then new ones; it
recreates the group when Redis lost it (``NOGROUP`` after a restart without
persistence).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import ValidationError
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError

from framerelay.results import ResultRecord
from ingest.bus import IdAllocator, IdKey, Published, format_id, parse_id
from ingest.settings import IngestSettings

log = logging.getLogger(__name__)
BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 5.0
TRIM_EVERY_S = 10.0
FIELD = "r"


def _aw(value: object) -> Awaitable[Any]:
    """redis-py types commands as ``T | Awaitable[T]``; on the asyncio client they await."""
    return cast("Awaitable[Any]", value)


def connect(url: str, *, timeout_s: float = 2.0) -> Redis:
    """An asyncio client that fails fast (the callers retry with their own backoff)."""
    return Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
        health_check_interval=0,
    )


@dataclass(frozen=True, slots=True)
class RedisKeys:
    prefix: str = "framerelay"

    def stream(self, stream_id: str) -> str:
        return f"{self.prefix}:results:{stream_id}"

    def channel(self, stream_id: str) -> str:
        return f"{self.prefix}:live:{stream_id}"


class PublisherMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.stored = Counter("framerelay_redis_stored", "Results added to Redis Streams",
                              registry=r)  # fmt: skip
        self.dropped = Counter(
            "framerelay_redis_dropped", "Results not stored, by reason", ["reason"], registry=r
        )
        self.errors = Counter("framerelay_redis_errors", "Failed Redis writes", registry=r)
        self.buffered = Gauge("framerelay_redis_buffered", "Results waiting for Redis",
                              registry=r)  # fmt: skip
        self.up = Gauge("framerelay_redis_up", "1 while Redis writes succeed", registry=r)


@dataclass(slots=True)
class _Entry:
    item: Published
    tried: bool = False
    live_done: bool = False


class RedisPublisher:
    """Bounded, non-blocking, pipelined writer of results to Redis."""

    def __init__(
        self,
        client: Redis,
        keys: RedisKeys,
        ids: IdAllocator,
        *,
        maxlen: int = 100_000,
        retention_s: float = 86_400.0,
        buffer: int = 10_000,
        batch: int = 256,
        live: bool = True,
        timeout_s: float = 2.0,
        trim_every_s: float = TRIM_EVERY_S,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._client = client
        self.trim_every_s = trim_every_s
        self.keys = keys
        self._ids = ids
        self.maxlen = maxlen
        self.retention_s = retention_s
        self.capacity = max(1, buffer)
        self.batch = max(1, batch)
        self.live = live
        self.timeout_s = timeout_s
        self.metrics = PublisherMetrics(registry or CollectorRegistry())
        self.counts: collections.Counter[str] = collections.Counter()
        self._buf: collections.deque[_Entry] = collections.deque()
        self._wake = asyncio.Event()
        self._streams: set[str] = set()
        self._next_trim = time.monotonic() + trim_every_s
        self.up = False

    def offer(self, item: Published) -> None:
        """Queue a result for Redis; O(1), never blocks (drops the oldest when full)."""
        self._push(_Entry(item))
        self._wake.set()

    def _push(self, entry: _Entry, *, front: bool = False) -> None:
        if front:
            self._buf.appendleft(entry)
        else:
            self._buf.append(entry)
        while len(self._buf) > self.capacity:
            self._buf.popleft()
            self._drop("buffer_full")
        self.metrics.buffered.set(len(self._buf))

    def _drop(self, reason: str, n: int = 1) -> None:
        self.counts[f"dropped_{reason}"] += n
        self.metrics.dropped.labels(reason).inc(n)

    @property
    def buffered(self) -> int:
        return len(self._buf)

    async def run(self, stop: asyncio.Event, *, final_flush_s: float = 3.0) -> None:
        """Drain the buffer until ``stop``; then flush what is left for ``final_flush_s``."""
        delay = BACKOFF_FIRST_S
        deadline: float | None = None
        while True:
            if stop.is_set() and deadline is None:
                deadline = time.monotonic() + final_flush_s
            if deadline is not None and (not self._buf or time.monotonic() > deadline):
                break
            if not self._buf:
                await self._idle(stop)
                continue
            if await self._write_batch():
                delay = BACKOFF_FIRST_S
                await self._trim_if_due()
            else:
                await _sleep_or(stop if deadline is None else None, delay)
                delay = min(delay * 2, BACKOFF_MAX_S)
        if self._buf:
            self._drop("shutdown", len(self._buf))
            self._buf.clear()

    async def _idle(self, stop: asyncio.Event) -> None:
        self._wake.clear()
        waiter = asyncio.create_task(self._wake.wait())
        stopper = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({waiter, stopper}, timeout=self.trim_every_s,
                               return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        finally:
            waiter.cancel()
            stopper.cancel()

    async def _write_batch(self) -> bool:
        batch = [self._buf.popleft() for _ in range(min(self.batch, len(self._buf)))]
        pipe = self._client.pipeline(transaction=False)
        for entry in batch:
            item = entry.item
            self._streams.add(item.stream_id)
            if self.live and not entry.live_done:
                pipe.publish(self.keys.channel(item.stream_id), item.json())
            pipe.xadd(self.keys.stream(item.stream_id), {FIELD: item.json()}, id=item.id,
                      maxlen=self.maxlen, approximate=True)  # fmt: skip
        try:
            async with asyncio.timeout(self.timeout_s):
                replies = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError, TimeoutError) as exc:
            for entry in reversed(batch):
                entry.tried = True
                self._push(entry, front=True)
            self._set_up(False, exc)
            return False
        self._set_up(True)
        await self._check_replies(batch, list(replies))
        self.metrics.buffered.set(len(self._buf))
        return True

    async def _check_replies(self, batch: list[_Entry], replies: list[object]) -> None:
        it = iter(replies)
        for entry in batch:
            if self.live and not entry.live_done:
                next(it)
                entry.live_done = True
            reply = next(it)
            if not isinstance(reply, Exception):
                self.counts["stored"] += 1
                self.metrics.stored.inc()
            elif "equal or smaller" in str(reply):
                await self._on_stale_id(entry)
            else:
                log.warning("Redis refused result %s: %s", entry.item.id, reply)
                self._drop("rejected")

    async def _on_stale_id(self, entry: _Entry) -> None:
        """The id is not above the stream's top: a retried duplicate, or our clock went back."""
        if entry.tried:
            self.counts["duplicate"] += 1
            return
        sid = entry.item.stream_id
        top = await _aw(self._client.xrevrange(self.keys.stream(sid), count=1))
        if top:
            self._ids.floor(sid, parse_id(top[0][0]))
        key = self._ids.next(sid)
        record = entry.item.record.model_copy(update={"id": format_id(key)})
        log.warning("stream %s: result id %s is behind Redis; stored as %s",
                    sid, entry.item.id, format_id(key))  # fmt: skip
        self.counts["reidentified"] += 1
        self._push(_Entry(Published(record, key), live_done=True), front=True)

    def _set_up(self, up: bool, exc: BaseException | None = None) -> None:
        if up != self.up:
            if up:
                log.info("Redis writes succeed again (%d buffered)", len(self._buf))
            else:
                log.warning("Redis unavailable (%s: %s); buffering up to %d results",
                            type(exc).__name__, exc, self.capacity)  # fmt: skip
        if not up:
            self.counts["errors"] += 1
            self.metrics.errors.inc()
        self.up = up
        self.metrics.up.set(1 if up else 0)

    async def _trim_if_due(self) -> None:
        now = time.monotonic()
        if now < self._next_trim or not self._streams:
            return
        self._next_trim = now + self.trim_every_s
        min_id = f"{int((time.time() - self.retention_s) * 1000)}-0"
        pipe = self._client.pipeline(transaction=False)
        for sid in self._streams:
            pipe.xtrim(self.keys.stream(sid), minid=min_id, approximate=True)
            pipe.pexpire(self.keys.stream(sid), int(self.retention_s * 1000) + 60_000)
        self._streams.clear()
        try:
            async with asyncio.timeout(self.timeout_s):
                await pipe.execute(raise_on_error=False)
        except (RedisError, OSError, TimeoutError) as exc:
            log.debug("trim failed: %s", exc)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def read_after(self, stream_id: str, after: IdKey, count: int) -> list[ResultRecord]:
        """Stored results of ``stream_id`` newer than ``after`` (for resuming subscribers)."""
        start = f"({format_id(after)}"
        entries = await _aw(self._client.xrange(self.keys.stream(stream_id), start, "+", count))
        return [r for r in (_record(f) for _, f in entries) if r is not None]


def _record(fields: dict[str, str] | None) -> ResultRecord | None:
    if not fields or FIELD not in fields:
        return None
    try:
        return ResultRecord.model_validate_json(fields[FIELD])
    except ValidationError:
        return None


async def _sleep_or(stop: asyncio.Event | None, seconds: float) -> None:
    if stop is None:
        await asyncio.sleep(seconds)
        return
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        pass


@dataclass(frozen=True, slots=True)
class Entry:
    """One durable result as a consumer sees it (``record`` None if unreadable)."""

    id: str
    record: ResultRecord | None


class ResultConsumer:
    """At-least-once reader of one stream's results through a consumer group.

    Call :meth:`read` in a loop and :meth:`ack` what you have safely handled.
    After a restart with the same ``consumer`` name its unacknowledged entries
    come first; entries other (dead) consumers left pending for
    ``claim_idle_ms`` are claimed; a group Redis lost is recreated.
    """

    def __init__(
        self,
        client: Redis,
        key: str,
        group: str,
        consumer: str,
        *,
        count: int = 100,
        block_ms: int = 1000,
        claim_idle_ms: int = 30_000,
        timeout_s: float = 2.0,
    ) -> None:
        self._client = client
        self.key, self.group, self.consumer = key, group, consumer
        self.count, self.block_ms = count, block_ms
        self.claim_idle_ms = claim_idle_ms
        self.timeout_s = timeout_s
        self.counts: collections.Counter[str] = collections.Counter()
        self._phase = "pending"
        self._pending_from = "0"
        self._claim_from = "0-0"
        self._next_claim = 0.0
        self._delay = BACKOFF_FIRST_S
        self._unacked: set[str] = set()

    async def ensure_group(self) -> bool:
        """Create the group (and the stream) if missing; True if it was created."""
        try:
            await _aw(self._client.xgroup_create(self.key, self.group, id="0", mkstream=True))
        except ResponseError as exc:
            if "BUSYGROUP" in str(exc):
                return False
            raise
        log.info("created consumer group %s on %s", self.group, self.key)
        return True

    async def read(self) -> list[Entry]:
        """The next entries to handle; [] when none came (or Redis is away, after a pause)."""
        try:
            async with asyncio.timeout(self.timeout_s + self.block_ms / 1000):
                entries = await self._read_phase()
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self.counts["group_recreated"] += 1
            log.warning("consumer group %s on %s is gone (Redis restarted without "
                        "persistence?); recreating it", self.group, self.key)  # fmt: skip
            await self._recover_group()
            return []
        except (RedisError, OSError, TimeoutError) as exc:
            self.counts["errors"] += 1
            log.warning("reading %s failed: %s: %s", self.key, type(exc).__name__, exc)
            await asyncio.sleep(self._delay)
            self._delay = min(self._delay * 2, BACKOFF_MAX_S)
            # After an outage, start over with our own pending entries: whatever we
            # handled but could not acknowledge comes again (callers dedupe by id).
            self._phase, self._pending_from = "pending", "0"
            return []
        self._delay = BACKOFF_FIRST_S
        if self._unacked:
            await self.ack([])
        return entries

    async def _recover_group(self) -> None:
        try:
            async with asyncio.timeout(self.timeout_s):
                await self.ensure_group()
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("recreating group %s failed: %s", self.group, exc)
            await asyncio.sleep(self._delay)
        self._phase, self._pending_from, self._claim_from = "pending", "0", "0-0"

    async def _read_phase(self) -> list[Entry]:
        if self._phase == "pending":
            return await self._read_pending()
        if self._phase == "claim" or time.monotonic() >= self._next_claim:
            return await self._claim()
        reply = await _aw(self._client.xreadgroup(
            self.group, self.consumer, {self.key: ">"}, count=self.count, block=self.block_ms
        ))  # fmt: skip
        return await self._entries(reply)

    async def _read_pending(self) -> list[Entry]:
        reply = await _aw(self._client.xreadgroup(
            self.group, self.consumer, {self.key: self._pending_from}, count=self.count
        ))  # fmt: skip
        entries = await self._entries(reply)
        if entries:
            self._pending_from = entries[-1].id
            self.counts["redelivered"] += len(entries)
        else:
            self._phase = "claim"
        return entries

    async def _claim(self) -> list[Entry]:
        reply = await _aw(self._client.xautoclaim(
            self.key, self.group, self.consumer, self.claim_idle_ms,
            start_id=self._claim_from, count=self.count,
        ))  # fmt: skip
        cursor, raw = str(reply[0]), reply[1]
        entries = await self._parse(raw)
        self.counts["claimed"] += len(entries)
        self._claim_from = cursor
        if cursor == "0-0":
            self._phase = "new"
            self._next_claim = time.monotonic() + self.claim_idle_ms / 1000
        return entries

    async def _entries(self, reply: Any) -> list[Entry]:
        if not reply:
            return []
        if isinstance(reply, dict):  # RESP3
            raw: Sequence[Any] = next(iter(reply.values()), [[]])[0]
        else:
            raw = reply[0][1]
        return await self._parse(raw)

    async def _parse(self, raw: Sequence[Any]) -> list[Entry]:
        out, gone = [], []
        for entry_id, fields in raw:
            if fields is None:  # trimmed while pending
                gone.append(str(entry_id))
                continue
            record = _record(fields)
            if record is None:
                self.counts["unreadable"] += 1
            out.append(Entry(str(entry_id), record))
        if gone:
            self.counts["trimmed"] += len(gone)
            await self.ack(gone)
        return out

    async def ack(self, ids: Sequence[str]) -> int:
        """Acknowledge handled entries; returns how many Redis still had pending.

        Never raises for Redis being away: ids that could not be acknowledged are
        kept and sent again with the next ``ack`` or successful ``read``.
        """
        self._unacked.update(ids)
        if not self._unacked:
            return 0
        todo = list(self._unacked)
        try:
            async with asyncio.timeout(self.timeout_s):
                n = int(await _aw(self._client.xack(self.key, self.group, *todo)))
        except (RedisError, OSError, TimeoutError) as exc:
            self.counts["ack_errors"] += 1
            log.debug("acknowledging %d entries failed: %s", len(todo), exc)
            return 0
        self._unacked.difference_update(todo)
        self.counts["acked"] += n
        return n


def publisher_from_settings(
    settings: IngestSettings, ids: IdAllocator, registry: CollectorRegistry
) -> RedisPublisher | None:
    """The publisher ``FRAMERELAY_REDIS_URL`` asks for, or None without one."""
    if settings.redis_url is None:
        return None
    r = settings.results
    return RedisPublisher(
        connect(settings.redis_url.get_secret_value(), timeout_s=r.redis_timeout_s),
        RedisKeys(r.redis_prefix),
        ids,
        maxlen=r.redis_maxlen,
        retention_s=r.redis_retention_s,
        buffer=r.redis_buffer,
        batch=r.redis_batch,
        live=r.redis_live,
        timeout_s=r.redis_timeout_s,
        registry=registry,
    )
