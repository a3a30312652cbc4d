"""The orchestrator service: builds the fleet from settings and runs its loop.

Only the holder of the leader lease acts (a second orchestrator, or one
restarted while the old lease is still valid, waits); every pass is a full
reconcile, so a restart at any moment is safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from deploy.clock import Clock, SystemClock
from deploy.fleet import Fleet
from deploy.health import Canary, Prober, WorkerProber
from deploy.ingest_link import HttpIngestLink, IngestLink, NullIngestLink
from deploy.providers.base import Provider
from deploy.settings import OrchestratorSettings
from deploy.store import Store
from framerelay.auth import TokenSigner
from framerelay.errors import ConfigError, FramerelayError
from framerelay.settings import split_secrets

log = logging.getLogger(__name__)
CANARY_TOKEN_TTL_S = 300.0


def make_provider(settings: OrchestratorSettings) -> Provider:
    if settings.provider == "local":
        from deploy.providers.local import LocalProvider

        return LocalProvider(settings.local)
    if settings.provider == "runpod":
        from deploy.providers.runpod import RunPodProvider

        return RunPodProvider(settings.runpod)
    from deploy.providers.kubernetes import KubernetesProvider

    return KubernetesProvider(settings.kubernetes)


def make_prober(settings: OrchestratorSettings) -> WorkerProber:
    signer = TokenSigner(split_secrets(settings.token_secrets))

    def token_for(worker: str) -> str:
        return signer.mint("orchestrator-canary", [f"worker:{worker}"], CANARY_TOKEN_TTL_S)

    canary = Canary(min_persons=settings.canary_min_persons, timeout_s=settings.canary_timeout_s)
    return WorkerProber(canary, token_for, heartbeat_timeout_s=settings.heartbeat_timeout_s)


class Orchestrator:
    def __init__(
        self,
        settings: OrchestratorSettings,
        *,
        provider: Provider | None = None,
        prober: Prober | None = None,
        ingest: IngestLink | None = None,
        clock: Clock | None = None,
        redis: Redis | None = None,
    ) -> None:
        if settings.token_secrets is None and prober is None:
            raise ConfigError(
                "the orchestrator needs FRAMERELAY_TOKEN_SECRETS (the workers' token secrets): "
                "pods get them, and canaries use them"
            )
        self.settings = settings
        self.redis = redis or Redis.from_url(settings.redis_url)
        self.store = Store(self.redis, settings.key_prefix)
        self.provider = provider or make_provider(settings)
        self._prober = prober or make_prober(settings)
        link = ingest or (
            HttpIngestLink(settings.ingest_url) if settings.ingest_url else NullIngestLink()
        )
        self.fleet = Fleet(
            settings, self.provider, self.store, self._prober, link, clock or SystemClock()
        )
        self.owner = secrets.token_hex(6)
        self.leader = False
        self.ticks = 0
        self.last_error: str | None = None

    async def step(self) -> bool:
        """One guarded pass; False when another orchestrator holds the lease."""
        self.leader = await self.store.lease(self.owner, self.settings.lease_ttl_s)
        if not self.leader:
            return False
        await self.fleet.tick()
        self.ticks += 1
        return True

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.step()
                self.last_error = None
            except (FramerelayError, RedisError, OSError) as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"[:500]
                log.warning("reconcile pass failed: %s", self.last_error)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.tick_s):
                    await stop.wait()

    async def aclose(self) -> None:
        with contextlib.suppress(RedisError, OSError):
            await self.store.release(self.owner)
        await self.fleet.ingest.aclose()
        closer: Any = getattr(self._prober, "aclose", None)
        if closer is not None:
            await closer()
        await self.provider.aclose()
        await self.redis.aclose()
