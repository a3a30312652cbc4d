"""The orchestrator service: builds the fleet from settings and runs its loop.

Only the holder of the leader lease acts (a second orchestrator, or one
restarted while the old lease is still valid, waits); every pass is a full
reconcile, so a restart at any moment is safe.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import secrets
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from deploy.clock import Clock, SystemClock
from deploy.fleet import Fleet
from deploy.health import Canary, Prober, WorkerProber
from deploy.history import FleetHistory
from deploy.ingest_link import HttpIngestLink, IngestLink, NullIngestLink
from deploy.jobs import JobDriver, JobStore
from deploy.latency import Latency, rtt_source
from deploy.pod_trust import TUNNEL_KEYS_ENV, PodTrust, make_trust
from deploy.providers.base import Provider
from deploy.settings import OrchestratorSettings
from deploy.store import Store
from deploy.tls import verify_context
from framerelay.auth import KeySet, TokenIssuer
from framerelay.auth.config import load_keys, require_keys
from framerelay.auth.tokens import worker_scope
from framerelay.errors import FramerelayError
from framerelay.model_registry import ModelRegistry, load_registry

if TYPE_CHECKING:
    from deploy.providers.runpod.endpoints import ServerlessEndpoints

log = logging.getLogger(__name__)
CANARY_TOKEN_TTL_S = 300.0


def make_provider(settings: OrchestratorSettings, clock: Clock | None = None) -> Provider:
    """The provider the settings name (``clock``: the orchestrator's, for the provider's
    own graces)."""
    if settings.provider == "local":
        from deploy.providers.local import LocalProvider

        return LocalProvider(settings.local)
    if settings.provider == "runpod":
        from deploy.providers.runpod.provider import RunPodProvider

        return RunPodProvider(settings.runpod)
    from deploy.providers.kubernetes.provider import KubernetesProvider

    return KubernetesProvider(settings.kubernetes, clock, settings.tiers)


def make_endpoints(settings: OrchestratorSettings, keys: KeySet) -> ServerlessEndpoints | None:
    """The keeper of the managed serverless tiers' endpoints; None without such a tier.
    Their workers get the public key set only (a shared volume's manifest is checked
    with it), never a key that signs."""
    if not any(t.serverless is not None for t in settings.tiers):
        return None
    from deploy.providers.runpod.endpoints import ServerlessEndpoints

    public = keys.public()
    env = {TUNNEL_KEYS_ENV: public.to_json()} if len(public) else {}
    return ServerlessEndpoints(settings.runpod, settings.fleet, settings.tiers, env)


def make_prober(
    settings: OrchestratorSettings, trust: PodTrust, registry: ModelRegistry | None = None
) -> WorkerProber:
    """Heartbeats and canaries with tunnel tokens the pods verify, over TLS checked
    against the pod CA (when TLS is on); each model's canary from ``registry`` (read from
    the settings when not given)."""
    issuer = TokenIssuer(trust.worker_keys)

    def token_for(worker: str) -> str:
        scope = [worker_scope(worker)]
        return issuer.mint("orchestrator-canary", scope, CANARY_TOKEN_TTL_S, aud="worker")

    ctx = verify_context(trust.ca.cert_path, "pods") if trust.ca is not None else None
    canary = Canary(
        min_persons=settings.canary_min_persons,
        timeout_s=settings.canary_timeout_s,
        registry=registry or load_registry(settings.model_registry),
    )
    return WorkerProber(
        canary, token_for, heartbeat_timeout_s=settings.heartbeat_timeout_s, ssl_context=ctx
    )


def orchestrator_keys(settings: OrchestratorSettings) -> KeySet:
    """Signing keys, then shared secrets; a clear ConfigError when there are none."""
    return require_keys(load_keys(settings.signing_keys, settings.token_secrets), "orchestrator")


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
        self.settings = settings
        self.keys = orchestrator_keys(settings)
        clock = clock or SystemClock()
        self.provider = provider or make_provider(settings, clock)
        self.serverless = make_endpoints(settings, self.keys)
        self.trust = make_trust(settings, self.keys, self.provider)
        self.registry = load_registry(settings.model_registry)  # a bad file: ConfigError
        self._prober = prober or make_prober(settings, self.trust, self.registry)
        link = ingest or self._ingest_link()
        self.redis = redis or Redis.from_url(settings.redis_url.get_secret_value())
        self.store = Store(self.redis, settings.key_prefix)
        self.fleet = Fleet(
            settings,
            self.provider,
            self.store,
            self._prober,
            link,
            clock,
            trust=self.trust,
            registry=self.registry,
            latency=Latency(rtt_source(settings, TokenIssuer(self.keys)), settings.rtt_interval_s),
        )
        jobs = settings.jobs
        self.jobs_redis = (
            Redis.from_url(jobs.redis_url.get_secret_value()) if jobs.redis_url else self.redis
        )
        self.jobs = JobStore(self.store, self.jobs_redis, jobs.redis_prefix)
        self.job_driver = JobDriver(settings, self.jobs, self.fleet.clock)
        self.history = FleetHistory([t.name for t in settings.tiers])
        self.auth_refused: collections.Counter[str] = collections.Counter()
        self.owner = secrets.token_hex(6)
        self.leader = False
        self.ticks = 0
        self.last_error: str | None = None

    def model_problem(self, model: str) -> str | None:
        """Why a stream may not name ``model`` (None: it may). With a model registry
        (``model_registry``) a model it lacks is refused, with the names it has; without
        one any well-formed name is taken and the workers' registries decide."""
        if self.settings.model_registry is None or model in self.registry:
            return None
        return (  # the name itself is not echoed (a 422 repeats no submitted value)
            f"unknown model: the orchestrator's model registry "
            f"({self.settings.model_registry.name}) has {self.registry.names()}"
        )

    def _ingest_link(self) -> IngestLink:
        url = self.settings.ingest_url
        if not url:
            return NullIngestLink()
        return HttpIngestLink(url, TokenIssuer(self.keys), ca=self.settings.ingest_ca)

    async def step(self) -> bool:
        """One guarded pass; False when another orchestrator holds the lease."""
        self.leader = await self.store.lease(self.owner, self.settings.lease_ttl_s)
        if not self.leader:
            return False
        await self.fleet.tick()
        if self.serverless is not None:  # managed serverless endpoints: made, kept
            await self.serverless.tick()
        await self.job_driver.tick()  # batch jobs: task streams for the next pass
        self.ticks += 1
        return True

    async def sample_history(self) -> None:
        """A point of the fleet's last hour, when one is due (:mod:`deploy.history`)."""
        now = self.fleet.clock.now()
        if self.history.due(now):
            self.history.sample(now, await self.store.pods(), await self.store.assignments())

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.step()
                await self.sample_history()
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
        await self.fleet.latency.aclose()
        closer: Any = getattr(self._prober, "aclose", None)
        if closer is not None:
            await closer()
        await self.provider.aclose()
        if self.serverless is not None:
            await self.serverless.aclose()
        if self.jobs_redis is not self.redis:
            await self.jobs_redis.aclose()
        await self.redis.aclose()
