"""The orchestrator's link reaches every sharded ingest replica; a placement is stored in
Redis and applied by the one replica that runs the stream (real APIs on 127.0.0.1, the
loopback Redis)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import httpx
import pytest

from deploy.ingest_link import HttpIngestLink
from deploy.models import StreamSpec
from framerelay.auth import TokenIssuer
from ingest.app import create_app
from ingest.service import IngestService
from ingest.settings import IngestSettings
from ingest.store import RedisStore
from tests.conftest import CLIP, REDIS_URL, RedisSpace
from tests.support.auth import ed_keys
from tests.support.orchestrator import serving_here
from tests.support.servers import free_port
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.integration


@asynccontextmanager
async def replica(name: str, prefix: str, keys: str) -> AsyncIterator[tuple[IngestService, str]]:
    settings = IngestSettings(
        signing_keys=keys, redis_url=REDIS_URL, store_key=f"{prefix}:streams",
        worker_url=f"ws://127.0.0.1:{free_port()}/v1/tunnel",  # nobody there
        shards={"enabled": True, "replica_id": name, "lease_ttl_s": 2, "renew_interval_s": 0.2,
                "prefix": prefix},
    )  # fmt: skip
    store = RedisStore(REDIS_URL, settings.store_key)
    service = IngestService(settings, store=store)
    stop = asyncio.Event()
    run = asyncio.create_task(service.run(stop))
    try:
        async with serving_here(create_app(service)) as base:
            yield service, base
    finally:
        stop.set()
        await asyncio.gather(run, return_exceptions=True)
        await store.close()


async def test_the_link_reaches_every_replica_and_one_runs_the_stream(
    redis_space: RedisSpace,
) -> None:
    redis, prefix = redis_space.client, redis_space.prefix
    keys = ed_keys()
    async with asyncio.timeout(60):
        async with AsyncExitStack() as stack:
            a, base_a = await stack.enter_async_context(replica("a", prefix, keys.to_json()))
            b, base_b = await stack.enter_async_context(replica("b", prefix, keys.to_json()))
            link = HttpIngestLink(f"{base_a}, {base_b}/", TokenIssuer(keys))
            stack.push_async_callback(link.aclose)
            spec = StreamSpec(id="cam-1", url=str(CLIP), realtime=True, loop=True)
            tunnel = f"ws://127.0.0.1:{free_port()}/v1/tunnel"
            assert await link.assign(spec, "gpu-7", tunnel)
            runs = [s for s in (a, b) if "cam-1" in s.streams]
            assert len(runs) == 1  # one replica runs it, the other only stored the route
            assert runs[0].registry.where["cam-1"] == "gpu-7"
            owner = base_a if runs[0] is a else base_b
            async with httpx.AsyncClient() as http:
                metrics = (await http.get(f"{owner}/metrics")).text
            assert 'framerelay_ingest_shard_stream_epoch{replica="' in metrics
            assert "framerelay_ingest_shard_live_replicas " in metrics
            assert await redis.hexists(f"{prefix}:routes", "cam-1")
            assert await link.unassign("cam-1")
            assert not await redis.hexists(f"{prefix}:routes", "cam-1")
            await wait_until_async(  # the owner stops it at once or within a renewal
                lambda: "cam-1" not in a.streams and "cam-1" not in b.streams,
                5,
                "cam-1 stopped",
                every_s=0.1,
            )
            assert "cam-1" not in a.streams and "cam-1" not in b.streams


async def test_the_stream_api_across_replicas(redis_space: RedisSpace) -> None:
    prefix = redis_space.prefix
    keys = ed_keys()
    token = TokenIssuer(keys).mint("test", ["streams:read", "streams:write"], 600, aud="ingest")
    auth = {"Authorization": f"Bearer {token}"}
    async with asyncio.timeout(60):
        async with AsyncExitStack() as stack:
            a, base_a = await stack.enter_async_context(replica("a", prefix, keys.to_json()))
            b, base_b = await stack.enter_async_context(replica("b", prefix, keys.to_json()))
            http = await stack.enter_async_context(httpx.AsyncClient(headers=auth))
            cam = {"id": "cam-9", "url": str(CLIP), "realtime": True, "loop": True}
            r = await http.post(f"{base_a}/v1/streams", json=cam)
            assert r.status_code in (200, 201), r.text
            assert "cam-9" in a.streams and "cam-9" not in b.streams
            r = await http.post(f"{base_b}/v1/streams", json=cam)
            assert r.status_code == 409, r.text  # runs on a
            r = await http.put(f"{base_b}/v1/streams/cam-9", json={**cam, "fps": 2})
            assert r.status_code == 404 and "replica 'a'" in r.text, r.text
            r = await http.delete(f"{base_b}/v1/streams/cam-9")
            assert r.status_code in (200, 204), r.text
            await wait_until_async(  # a stops it at its next renewal
                lambda: "cam-9" not in a.streams, 5, "cam-9 stopped on a", every_s=0.1
            )
            assert "cam-9" not in a.streams and "cam-9" not in b.streams
