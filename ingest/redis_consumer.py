"""At-least-once reading of a stream's durable results through a consumer group.

:class:`ResultConsumer` reads its own pending entries first (after a restart),
stale entries of dead consumers (``XAUTOCLAIM``), then new ones; it recreates
the group when Redis lost it (``NOGROUP`` after a restart without
persistence). Each :class:`Entry` carries the result's id, the Redis entry id
(which is the id the WebSocket API and sidecars use, see
:mod:`ingest.redis_bus`); stored results with fields this reader does not know
are read, those fields ignored.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from framerelay.results import ResultId, ResultRecord
from ingest.redis_bus import BACKOFF_FIRST_S, BACKOFF_MAX_S, awaitable, stored_record

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Entry:
    """One durable result as a consumer sees it (``record`` None if unreadable)."""

    id: ResultId
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
        self._unacked: set[ResultId] = set()

    async def ensure_group(self) -> bool:
        """Create the group (and the stream) if missing; True if it was created."""
        try:
            await awaitable(self._client.xgroup_create(self.key, self.group, id="0", mkstream=True))
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
        reply = await awaitable(self._client.xreadgroup(
            self.group, self.consumer, {self.key: ">"}, count=self.count, block=self.block_ms
        ))  # fmt: skip
        return await self._entries(reply)

    async def _read_pending(self) -> list[Entry]:
        reply = await awaitable(self._client.xreadgroup(
            self.group, self.consumer, {self.key: self._pending_from}, count=self.count
        ))  # fmt: skip
        entries = await self._entries(reply)
        if entries:
            self._pending_from = str(entries[-1].id)
            self.counts["redelivered"] += len(entries)
        else:
            self._phase = "claim"
        return entries

    async def _claim(self) -> list[Entry]:
        reply = await awaitable(self._client.xautoclaim(
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
            rid = ResultId.parse(str(entry_id))
            if fields is None:  # trimmed while pending
                gone.append(rid)
                continue
            record = stored_record(fields, rid)
            if record is None:
                self.counts["unreadable"] += 1
            out.append(Entry(rid, record))
        if gone:
            self.counts["trimmed"] += len(gone)
            await self.ack(gone)
        return out

    async def ack(self, ids: Sequence[ResultId]) -> int:
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
                n = int(await awaitable(self._client.xack(self.key, self.group, *map(str, todo))))
        except (RedisError, OSError, TimeoutError) as exc:
            self.counts["ack_errors"] += 1
            log.debug("acknowledging %d entries failed: %s", len(todo), exc)
            return 0
        self._unacked.difference_update(todo)
        self.counts["acked"] += n
        return n
