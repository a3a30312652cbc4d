"""Stream leases in Redis, with fencing epochs: who among the ingest replicas runs a stream.

Keys (``prefix`` from :class:`ingest.shard_settings.ShardSettings`):

* ``<prefix>:replicas`` - sorted set, member = replica id, score = when its
  lease ends (ms, Redis's own clock); expired members are dropped on read.
* ``<prefix>:lease:<stream>`` - ``<replica>|<epoch>``, with a TTL. Taken only
  when absent (``acquire``); renewed and released only by the holder of that
  very epoch. ``<prefix>:epoch:<stream>`` counts the takes: the fencing token.
* ``<prefix>:snap:<stream>`` - the stream's latest tracker snapshot (clock as
  JSON + blob), written only under a valid lease (a fenced-off replica cannot
  overwrite its successor's), kept ``snapshot_ttl_s``.
* ``<prefix>:routes`` - hash: stream -> the orchestrator's placement (worker
  id, url, TLS name, definition), shared by every replica.
* ``<prefix>:log`` - Redis Stream of transitions (``stream``, ``owner``,
  ``epoch``, ``event``: acquire, start, stop, release, lost), capped (~10000).

Every operation is one Lua script or one command: atomic on the server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

import msgspec
from redis.asyncio import Redis

from framerelay import wire
from framerelay.protocol import SessionSnapshot

LOG_MAXLEN = 10_000
TIMEOUT_S = 2.0

_HEARTBEAT = """
local now = redis.call('TIME')
local ms = now[1] * 1000 + math.floor(now[2] / 1000)
redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms)
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""
_ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local owner, epoch = string.match(cur, '^(.*)|(%d+)$')
  if owner == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return tonumber(epoch)
  end
  return 0
end
local epoch = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. epoch, 'PX', ARGV[2])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'stream', ARGV[3], 'owner', ARGV[1],
           'epoch', epoch, 'event', 'acquire')
return epoch
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""
_FENCED_SET = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""


@dataclass(frozen=True, slots=True)
class Route:
    """The orchestrator's placement of a stream (see :mod:`ingest.routing`)."""

    worker_id: str
    url: str
    tls_server_name: str | None
    stream: dict[str, Any] | None
    """The definition it sent (secrets included: keep Redis private)."""


class LeaseBoard:
    """The Redis side of sharding for one replica (see the module doc)."""

    def __init__(self, redis: Redis, prefix: str, replica: str, ttl_s: float) -> None:
        self.redis = redis
        self.prefix = prefix
        self.replica = replica
        self.ttl_ms = max(1, round(ttl_s * 1000))
        self._heartbeat = redis.register_script(_HEARTBEAT)
        self._acquire = redis.register_script(_ACQUIRE)
        self._renew = redis.register_script(_RENEW)
        self._release = redis.register_script(_RELEASE)
        self._fenced_set = redis.register_script(_FENCED_SET)

    def key(self, kind: str, stream_id: str = "") -> str:
        return f"{self.prefix}:{kind}:{stream_id}" if stream_id else f"{self.prefix}:{kind}"

    def _holder(self, epoch: int) -> str:
        return f"{self.replica}|{epoch}"

    async def heartbeat(self) -> list[str]:
        """Renew this replica's own lease; the live replicas (this one included)."""
        live = await self._heartbeat(keys=[self.key("replicas")], args=[self.replica, self.ttl_ms])
        return sorted(m.decode() for m in cast(list[bytes], live))

    async def acquire(self, stream_id: str) -> int:
        """Take the stream's lease if it is free (or already ours): its epoch, else 0."""
        keys = [self.key("lease", stream_id), self.key("epoch", stream_id), self.key("log")]
        args: list[str | int] = [self.replica, self.ttl_ms, stream_id, LOG_MAXLEN]
        return int(await self._acquire(keys=keys, args=args))

    async def renew(self, stream_id: str, epoch: int) -> bool:
        """Extend our lease of that epoch; False when it is gone or another's."""
        keys = [self.key("lease", stream_id)]
        return bool(await self._renew(keys=keys, args=[self._holder(epoch), self.ttl_ms]))

    async def release(self, stream_id: str, epoch: int) -> bool:
        keys = [self.key("lease", stream_id)]
        return bool(await self._release(keys=keys, args=[self._holder(epoch)]))

    async def owners(self, stream_ids: list[str]) -> dict[str, tuple[str, int]]:
        """Stream -> (replica, epoch) for the leased ones."""
        if not stream_ids:
            return {}
        values = await self.redis.mget([self.key("lease", s) for s in stream_ids])
        out = {}
        for sid, raw in zip(stream_ids, values, strict=True):
            if raw is not None:
                owner, _, epoch = _text(raw).rpartition("|")
                out[sid] = (owner, int(epoch))
        return out

    async def log(self, stream_id: str, epoch: int, event: str) -> None:
        fields: dict[Any, Any] = {
            "stream": stream_id,
            "owner": self.replica,
            "epoch": epoch,
            "event": event,
        }
        await self.redis.xadd(self.key("log"), fields, maxlen=LOG_MAXLEN, approximate=True)

    async def put_snapshot(
        self, stream_id: str, epoch: int, snapshot: SessionSnapshot, ttl_s: float
    ) -> bool:
        """Store the stream's latest snapshot, only while we hold its lease of ``epoch``."""
        clock, blob = snapshot
        value = msgspec.json.encode(clock) + b"\n" + blob
        keys = [self.key("lease", stream_id), self.key("snap", stream_id)]
        args: list[str | bytes | int] = [self._holder(epoch), value, max(1, round(ttl_s * 1000))]
        return bool(await self._fenced_set(keys=keys, args=args))

    async def snapshot(self, stream_id: str) -> SessionSnapshot | None:
        raw = await self.redis.get(self.key("snap", stream_id))
        if raw is None:
            return None
        head, _, blob = (raw if isinstance(raw, bytes) else raw.encode()).partition(b"\n")
        try:
            return msgspec.json.decode(head, type=wire.SessionClock), blob
        except msgspec.ValidationError:
            return None

    async def put_route(self, stream_id: str, route: Route) -> None:
        doc = {"worker_id": route.worker_id, "url": route.url,
               "tls_server_name": route.tls_server_name, "stream": route.stream}  # fmt: skip
        await self.redis.hset(self.key("routes"), stream_id, json.dumps(doc))

    async def drop_route(self, stream_id: str) -> None:
        await self.redis.hdel(self.key("routes"), stream_id)

    async def routes(self) -> dict[str, Route]:
        raw = await self.redis.hgetall(self.key("routes"))
        out = {}
        for field, value in raw.items():
            try:
                doc = json.loads(value)
                route = Route(doc["worker_id"], doc["url"], doc.get("tls_server_name"),
                              doc.get("stream"))  # fmt: skip
                out[_text(field)] = route
            except (ValueError, KeyError, TypeError):
                continue  # not ours to fix; the orchestrator sends it again
        return out


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
