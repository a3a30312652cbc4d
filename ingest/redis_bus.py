"""Results in Redis: live PUBLISH and durable Streams (read them with
:class:`ingest.redis_consumer.ResultConsumer`).

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
make retries idempotent.

Ids: the result bus settles each id once, before any fan-out, and the entry
id *is* that id; the publisher never renames a result (WebSocket subscribers
already have it). Redis only takes ids above a stream's last one, so:

* at start, :meth:`RedisPublisher.prime` floors the bus's id allocator at each
  stored stream's last id (an ingest restarted with its clock behind, or on
  another host, continues above what Redis holds);
* a refused id that Redis holds with this very result is a retried write
  (``duplicate``); any other refused id (Redis was unreachable at start, the
  clock stepped back, a second writer) is not stored: dropped and counted
  (``framerelay_redis_dropped_total{reason="stale_id"}``), and the allocator is
  floored so that the stream's next results are stored again.

So an id names one result everywhere; a result is in Redis under its own id or
not at all.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, cast

from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import ValidationError
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError

from framerelay.results import ResultId, ResultRecord
from ingest.bus import IdAllocator, Published
from ingest.settings import IngestSettings

log = logging.getLogger(__name__)
BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 5.0
TRIM_EVERY_S = 10.0
PRIME_TIMEOUT_S = 5.0
FIELD = "r"
STALE = "equal or smaller"


def awaitable(value: object) -> Awaitable[Any]:
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

    def stream_id(self, key: str) -> str | None:
        """The stream a :meth:`stream` key names (None for another key)."""
        head = f"{self.prefix}:results:"
        return key[len(head) :] if key.startswith(head) and len(key) > len(head) else None

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
        self._unexpected: set[str] = set()

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
            if await self._step():
                delay = BACKOFF_FIRST_S
            else:
                await _sleep_or(stop if deadline is None else None, delay)
                delay = min(delay * 2, BACKOFF_MAX_S)
        if self._buf:
            self._drop("shutdown", len(self._buf))
            self._buf.clear()

    async def _step(self) -> bool:
        """One batch written (True) or not. Supervised: an unexpected error (a bug, a
        reply of a shape we did not expect) is logged with its traceback and counted,
        then writing goes on after the backoff; it never ends Redis writes for good."""
        try:
            if not await self._write_batch():
                return False
            await self._trim_if_due()
        except Exception as exc:
            self.counts["errors"] += 1
            self.metrics.errors.inc()
            kind = type(exc).__name__
            if kind not in self._unexpected:
                self._unexpected.add(kind)
                log.exception("unexpected error writing results to Redis; carrying on")
            else:
                log.error("unexpected error writing results to Redis (%s); carrying on", kind)
            return False
        return True

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
            pipe.xadd(self.keys.stream(item.stream_id), {FIELD: item.json()}, id=str(item.id),
                      maxlen=self.maxlen, approximate=True)  # fmt: skip
        try:
            async with asyncio.timeout(self.timeout_s):
                replies = await pipe.execute(raise_on_error=False)
        except (RedisError, OSError, TimeoutError) as exc:
            for entry in reversed(batch):
                self._push(entry, front=True)
            self._set_up(False, exc)
            return False
        except Exception:  # not Redis being away: a batch that cannot be sent is dropped
            self._drop("error", len(batch))
            raise
        self._set_up(True)
        await self._check_replies(batch, list(replies))
        self.metrics.buffered.set(len(self._buf))
        return True

    async def _check_replies(self, batch: list[_Entry], replies: list[object]) -> None:
        it = iter(replies)
        stale: list[_Entry] = []
        for entry in batch:
            if self.live and not entry.live_done:
                next(it)
                entry.live_done = True
            reply = next(it)
            if not isinstance(reply, Exception):
                self.counts["stored"] += 1
                self.metrics.stored.inc()
            elif STALE in str(reply):
                stale.append(entry)
            else:
                log.warning("Redis refused result %s: %s", entry.item.id, reply)
                self._drop("rejected")
        if stale:
            await self._settle_stale(stale)

    async def _settle_stale(self, stale: list[_Entry]) -> None:
        """Redis refused these ids (not above the stream's last id). One Redis holds with
        this very result came from a retried write (``duplicate``); the others are dropped,
        never renamed, and the allocator is floored at the stream's last id so that the
        next results are stored."""
        streams = sorted({e.item.stream_id for e in stale})
        replies = await self._stale_facts(streams, stale)
        for sid, info in zip(streams, replies[: len(streams)], strict=True):
            last = _last_id(info)
            if last is not None:
                self._ids.floor(sid, last)
        checks = zip(stale, replies[len(streams) :], strict=True)
        held = {id(e) for e, reply in checks if _holds(reply, e.item)}
        self.counts["duplicate"] += len(held)
        for sid in streams:
            lost = [e for e in stale if e.item.stream_id == sid and id(e) not in held]
            if lost:
                log.warning("stream %s: Redis holds newer ids than %d result(s) (%s..%s): not "
                            "stored (never renamed); later results get ids above %s", sid,
                            len(lost), lost[0].item.id, lost[-1].item.id,
                            self._ids.last(sid))  # fmt: skip
                self._drop("stale_id", len(lost))

    async def _stale_facts(self, streams: list[str], stale: list[_Entry]) -> list[object]:
        """``XINFO STREAM`` of each stream, then the entry Redis holds under each id."""
        pipe = self._client.pipeline(transaction=False)
        for sid in streams:
            pipe.xinfo_stream(self.keys.stream(sid))
        for e in stale:
            rid = str(e.item.id)
            pipe.xrange(self.keys.stream(e.item.stream_id), rid, rid, count=1)
        try:
            async with asyncio.timeout(self.timeout_s):
                return list(await pipe.execute(raise_on_error=False))
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("checking %d refused result ids failed: %s", len(stale), exc)
            return [exc] * (len(streams) + len(stale))

    async def prime(self, timeout_s: float = PRIME_TIMEOUT_S) -> int:
        """Floor the id allocator at every stored stream's last id, before publishing
        starts; returns how many streams Redis holds. With Redis away it warns and
        returns 0 (refused ids are then dropped and counted, see the module doc)."""
        pattern = self.keys.stream("*")
        n = 0
        try:
            async with asyncio.timeout(timeout_s):
                async for key in self._client.scan_iter(match=pattern, count=1000, _type="stream"):
                    sid = self.keys.stream_id(str(key))
                    last = await self._last_of(str(key))
                    if sid is not None and last is not None:
                        self._ids.floor(sid, last)
                        n += 1
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("could not read the last result ids from Redis (%s: %s); results it "
                        "refuses will be dropped and counted", type(exc).__name__, exc)  # fmt: skip
        return n

    async def _last_of(self, key: str) -> ResultId | None:
        """The last id stream ``key`` gave (None once it expired meanwhile)."""
        try:
            return _last_id(await awaitable(self._client.xinfo_stream(key)))
        except ResponseError:  # no such key (expired since the scan)
            return None

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

    async def read_after(self, stream_id: str, after: ResultId, count: int) -> list[Published]:
        """Stored results of ``stream_id`` newer than ``after`` (for resuming subscribers)."""
        start = f"({after}"
        key = self.keys.stream(stream_id)
        entries = await awaitable(self._client.xrange(key, start, "+", count))
        out = []
        for raw_id, fields in entries:
            rid = ResultId.parse(str(raw_id))
            record = stored_record(fields, rid)
            if record is not None:
                out.append(Published(record, rid, fields[FIELD]))
        return out


def _holds(reply: object, item: Published) -> bool:
    """Whether an ``XRANGE id id`` reply is ``item`` itself (stored by an earlier try)."""
    if not isinstance(reply, list) or not reply:
        return False
    fields = reply[0][1]
    return isinstance(fields, dict) and fields.get(FIELD) == item.json()


def _last_id(info: object) -> ResultId | None:
    """The ``last-generated-id`` of an ``XINFO STREAM`` reply (None: no such stream)."""
    if not isinstance(info, dict):
        return None
    raw = info.get("last-generated-id")
    return ResultId.parse(str(raw)) if raw else None


def stored_record(fields: dict[str, str] | None, rid: ResultId) -> ResultRecord | None:
    """The stored record, if it reads (unknown fields ignored) and names itself ``rid``."""
    if not fields or FIELD not in fields:
        return None
    try:
        record = ResultRecord.model_validate_json(fields[FIELD])
    except ValidationError:
        return None
    if record.id != rid:
        log.warning("Redis entry %s holds a result named %s: skipped", rid, record.id)
        return None
    return record


async def _sleep_or(stop: asyncio.Event | None, seconds: float) -> None:
    if stop is None:
        await asyncio.sleep(seconds)
        return
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        pass


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
