"""The orchestrator's state in Redis (all keys under one prefix).

==========================  ======  ==========================================
key                         type    value
==========================  ======  ==========================================
``<p>pods``                 hash    pod name -> PodRecord JSON
``<p>streams``              hash    stream id -> StreamSpec JSON
``<p>assign``               hash    stream id -> pod name (one worker each)
``<p>replacements:<tier>``  zset    replacement times (restart budget)
``<p>cost``                 hash    accumulated cost figures (floats)
``<p>pins``                 hash    stream id -> pod name (operator moves)
``<p>floor``                hash    tier -> operator-requested minimum pods
``<p>gens``                 hash    "<tier>:<slot>" -> next generation number
``<p>cost_clock``           hash    time of the last cost accrual
``<p>leader``               string  lease of the active orchestrator
==========================  ======  ==========================================

Every write is a single command (or one MULTI), so a crash leaves a consistent
state; the reconcile loop repairs the rest on start.
"""

from __future__ import annotations

from collections.abc import Mapping

from redis.asyncio import Redis

from deploy.models import STORED, PodRecord, StreamSpec


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Store:
    def __init__(self, redis: Redis, prefix: str) -> None:
        """``redis`` must return bytes (``decode_responses=False``, the default)."""
        self.r = redis
        self.p = prefix

    async def pods(self) -> dict[str, PodRecord]:
        raw = await self.r.hgetall(self.p + "pods")
        return {_s(k): PodRecord.model_validate_json(v) for k, v in raw.items()}

    async def put_pod(self, rec: PodRecord) -> None:
        await self.r.hset(self.p + "pods", rec.name, rec.model_dump_json())

    async def del_pod(self, name: str) -> None:
        await self.r.hdel(self.p + "pods", name)

    async def streams(self) -> dict[str, StreamSpec]:
        raw = await self.r.hgetall(self.p + "streams")
        return {_s(k): StreamSpec.model_validate_json(v, context=STORED) for k, v in raw.items()}

    async def put_stream(self, spec: StreamSpec) -> None:
        await self.r.hset(self.p + "streams", spec.id, spec.model_dump_json())

    async def del_stream(self, stream_id: str) -> bool:
        async with self.r.pipeline(transaction=True) as pipe:
            pipe.hdel(self.p + "streams", stream_id)
            pipe.hdel(self.p + "assign", stream_id)
            pipe.hdel(self.p + "pins", stream_id)
            removed, *_ = await pipe.execute()
        return bool(removed)

    async def assignments(self) -> dict[str, str]:
        raw = await self.r.hgetall(self.p + "assign")
        return {_s(k): _s(v) for k, v in raw.items()}

    async def set_assignment(self, stream_id: str, pod: str | None) -> None:
        if pod is None:
            await self.r.hdel(self.p + "assign", stream_id)
        else:
            await self.r.hset(self.p + "assign", stream_id, pod)

    async def pins(self) -> dict[str, str]:
        raw = await self.r.hgetall(self.p + "pins")
        return {_s(k): _s(v) for k, v in raw.items()}

    async def set_pin(self, stream_id: str, pod: str | None) -> None:
        if pod is None:
            await self.r.hdel(self.p + "pins", stream_id)
        else:
            await self.r.hset(self.p + "pins", stream_id, pod)

    async def floors(self) -> dict[str, int]:
        raw = await self.r.hgetall(self.p + "floor")
        return {_s(k): int(v) for k, v in raw.items()}

    async def raise_floor(self, tier: str, by: int) -> int:
        """Operator-requested extra warm pods of a tier (never below 0)."""
        value = int(await self.r.hincrby(self.p + "floor", tier, by))
        if value < 0:
            await self.r.hset(self.p + "floor", tier, 0)
            value = 0
        return value

    async def next_gen(self, tier: str, slot: int) -> int:
        """A fresh generation number for a slot (names never repeat)."""
        return int(await self.r.hincrby(self.p + "gens", f"{tier}:{slot}", 1)) - 1

    async def mark_accrual(self, now: float) -> float | None:
        """Record ``now`` as the last cost accrual; returns the previous one."""
        old = await self.r.hget(self.p + "cost_clock", "t")
        await self.r.hset(self.p + "cost_clock", "t", repr(now))
        return float(old) if old is not None else None

    async def replacements_since(self, tier: str, since: float) -> int:
        key = f"{self.p}replacements:{tier}"
        await self.r.zremrangebyscore(key, "-inf", f"({since}")
        return int(await self.r.zcard(key))

    async def add_replacement(self, tier: str, t: float, name: str) -> None:
        await self.r.zadd(f"{self.p}replacements:{tier}", {name: t})

    async def add_cost(self, inc: Mapping[str, float]) -> None:
        if not inc:
            return
        async with self.r.pipeline(transaction=True) as pipe:
            for k, v in inc.items():
                pipe.hincrbyfloat(self.p + "cost", k, v)
            await pipe.execute()

    async def cost(self) -> dict[str, float]:
        raw = await self.r.hgetall(self.p + "cost")
        return {_s(k): float(v) for k, v in raw.items()}

    async def lease(self, owner: str, ttl_s: float) -> bool:
        """Take or renew the leader lease; False while another owner holds it."""
        key = self.p + "leader"
        ms = max(1, int(ttl_s * 1000))
        if await self.r.set(key, owner, nx=True, px=ms):
            return True
        held = await self.r.get(key)
        if held is not None and _s(held) == owner:
            await self.r.pexpire(key, ms)
            return True
        return False

    async def release(self, owner: str) -> None:
        key = self.p + "leader"
        held = await self.r.get(key)
        if held is not None and _s(held) == owner:
            await self.r.delete(key)

    async def clear(self) -> None:
        """Delete every key under the prefix (tests, and `fleet reset`)."""
        async for key in self.r.scan_iter(match=self.p + "*", count=500):
            await self.r.delete(key)
