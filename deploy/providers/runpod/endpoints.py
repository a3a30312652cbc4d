"""RunPod serverless endpoints the orchestrator manages: one per serverless tier.

A tier with ``serverless`` (:class:`deploy.settings.ServerlessConfig`) runs its job
tasks on a queue-based RunPod serverless endpoint that the orchestrator creates and
keeps as the settings say, through ``/v2/serverless`` of RunPod's REST API v2:

* **Name**: ``<fleet>-<tier>`` (:func:`endpoint_name`), so ``framerelay runpod check``
  finds the product's endpoints by the fleet's prefix and a restarted orchestrator
  finds its own: ``GET /v2/serverless`` is read first, and an endpoint of that name is
  taken, never made again.
* **Body** (:func:`endpoint_body`): ``type`` ``QUEUE``; the worker image
  (``runpod.image``, ``registry``, ``container_disk_gb``) started as ``worker
  --serverless`` (the image's entrypoint is ``framerelay``; the handler is
  :mod:`gpu_worker.serverless`); ``env``: the worker's id (the endpoint's name), the
  public key set (a shared volume's signed manifest is checked with it), and with a
  network volume its cache folders under ``/runpod-volume`` (where a serverless worker
  sees a network volume); ``gpu``: the serverless pools of the tier's ``gpu_types``
  (the catalog's ``pool``), the pools' other types in ``excludedTypes`` so that
  workers run only on the types the tier names, one GPU a worker, the pods' host CUDA
  constraint; ``workers`` min 0, max the tier's ``max_workers``, ``idleTimeout``;
  ``scaling`` ``QUEUE_DELAY``; ``dataCenterIds`` (the tier's, else its volume's);
  ``networkVolumes``; ``timeout`` (ms); ``flashboot``.
* **Update**: an endpoint that differs from the body gets one ``PATCH`` of the
  differing fields alone (:func:`patch_body`); one that matches is left alone.
* **Create** is sent once at a time (RunPod may make the endpoint and lose the
  answer): after a 5xx or a lost answer the endpoints are listed again and one of the
  name is taken before another create is sent.
* **Request URLs** come from RunPod's answer (``requestUrls``: ``run``, ``status``,
  ``cancel``, ``health``), never built from the id (:func:`request_urls`); a job's
  tasks carry them to the ingest.

:class:`ServerlessEndpoints` does this for every serverless tier at the orchestrator's
start (on each pass until it succeeds) and every :data:`RECHECK_S` after, so an
endpoint changed or deleted in RunPod's console is put back; settings changed between
two runs are applied at the next start. A tier whose endpoint is not ready takes no
job (:func:`deploy.serverless_jobs.choose`). Endpoints of tiers no longer in the
settings are left as they are (``framerelay runpod check`` lists them).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import ValidationError

from deploy.providers.base import ProviderError
from deploy.providers.runpod.client import RunPodHttp, check, json_body, refusal
from deploy.settings import VOLUME_ENV, RunPodSettings, ServerlessConfig, TierConfig, TierVolume
from framerelay.errors import ConfigError
from framerelay.jobs import EndpointUrls
from framerelay.net import plain_http_problem

log = logging.getLogger(__name__)
SERVERLESS_VOLUME = "/runpod-volume"
"""Where a serverless worker sees its endpoint's network volume."""
WORKER_ARGS = "worker --serverless"
"""The arguments of the image's ``framerelay`` entrypoint: the serverless handler."""
WORKER_ID_ENV = "FRAMERELAY_WORKER_WORKER_ID"
RECHECK_S = 300.0
"""Seconds between two reconciles once the endpoints are as the settings say."""
URL_KEYS = ("run", "status", "cancel", "health")
_COMPARED = (
    "image",
    "args",
    "disk",
    "env",
    "registry",
    "workers",
    "scaling",
    "dataCenterIds",
    "networkVolumes",
    "timeout",
    "flashboot",
)
"""The endpoint's fields compared with the settings (``gpu`` apart: see _gpu_key)."""


def endpoint_name(fleet: str, tier: str) -> str:
    """The endpoint of ``tier``: ``<fleet>-<tier>``."""
    return f"{fleet}-{tier}"


@dataclass(frozen=True, slots=True)
class ManagedEndpoint:
    """A tier's endpoint as RunPod answered for it."""

    tier: str
    name: str
    id: str
    urls: EndpointUrls


@dataclass(frozen=True, slots=True)
class GpuChoice:
    """The serverless pools of a tier's GPU types, and the pools' other types."""

    pools: tuple[str, ...]
    excluded: tuple[str, ...]


def gpu_choice(tier: TierConfig, pools_by_type: Mapping[str, str | None]) -> GpuChoice:
    """Which pools ``tier``'s ``gpu_types`` are in (the catalog's ``pool`` of each type),
    and the types of those pools it does not name (to exclude)."""
    pools: list[str] = []
    for gpu_type in tier.gpu_types:
        pool = pools_by_type.get(gpu_type)
        if pool and pool not in pools:
            pools.append(pool)
    if not pools:
        raise ProviderError(
            f"tier {tier.name}: none of its gpu_types ({', '.join(tier.gpu_types)}) is in a "
            "RunPod serverless pool (the catalog's pool is null or the type unknown): name "
            "GPU types RunPod sells on serverless"
        )
    excluded = sorted(
        t for t, pool in pools_by_type.items() if pool in pools and t not in tier.gpu_types
    )
    return GpuChoice(tuple(pools), tuple(excluded))


def _volume(tier: TierConfig, settings: RunPodSettings) -> tuple[str | None, dict[str, str]]:
    """(network volume id, the worker env it brings): the tier's, else the fleet's."""
    volume = tier.volume if tier.volume is not None and tier.volume.runpod_id else None
    if volume is not None:
        return volume.runpod_id, volume.worker_env(SERVERLESS_VOLUME)
    if settings.network_volume_id:
        return settings.network_volume_id, {VOLUME_ENV: SERVERLESS_VOLUME}
    return None, {}


def _centres(tier: TierConfig) -> list[str]:
    """The tier's data centres, else its network volume's (workers mount it only there)."""
    if tier.data_centers:
        return list(tier.data_centers)
    volume = tier.volume or TierVolume()
    return [volume.data_center] if volume.runpod_id and volume.data_center else []


def endpoint_body(
    tier: TierConfig,
    config: ServerlessConfig,
    settings: RunPodSettings,
    name: str,
    gpu: GpuChoice,
    worker_env: Mapping[str, str],
) -> dict[str, Any]:
    """The ``POST /v2/serverless`` body of ``tier``'s endpoint (see the module)."""
    volume_id, volume_env = _volume(tier, settings)
    gpu_body: dict[str, Any] = {"pools": list(gpu.pools), "count": 1, **settings.cuda}
    if gpu.excluded:
        gpu_body["excludedTypes"] = list(gpu.excluded)
    body: dict[str, Any] = {
        "name": name,
        "type": "QUEUE",
        "image": settings.image,
        "args": WORKER_ARGS,
        "disk": settings.container_disk_gb,
        "env": {**volume_env, **worker_env, WORKER_ID_ENV: name},
        "gpu": gpu_body,
        "workers": {"min": 0, "max": tier.max_workers, "idleTimeout": config.idle_timeout_s},
        "scaling": {"type": "QUEUE_DELAY", "queueDelay": config.queue_delay_s},
        "dataCenterIds": _centres(tier),
        "networkVolumes": [volume_id] if volume_id else [],
        "timeout": config.execution_timeout_s * 1000,
        "flashboot": config.flashboot,
    }
    if settings.registry:
        body["registry"] = settings.registry
    return body


def _gpu_key(gpu: object) -> tuple[Any, ...]:
    """What of a ``gpu`` selection is compared (an absent list is empty, an absent floor
    none)."""
    g: Mapping[str, Any] = gpu if isinstance(gpu, dict) else {}
    return (
        tuple(g.get("pools") or ()),
        tuple(sorted(g.get("excludedTypes") or ())),
        g.get("count") or 1,
        tuple(g.get("allowedCudaVersions") or ()),
        g.get("minCudaVersion") or None,
    )


def _gpu_patch(desired: Mapping[str, Any]) -> dict[str, Any]:
    """The ``gpu`` of a PATCH: the whole selection, the exclusions restated (pools alone
    would clear them), and the CUDA constraint with the other one cleared (a PATCH
    setting one does not clear the other)."""
    gpu: dict[str, Any] = {
        "pools": desired["pools"],
        "excludedTypes": desired.get("excludedTypes", []),
        "count": desired.get("count", 1),
    }
    allowed = desired.get("allowedCudaVersions")
    if allowed:
        gpu.update(allowedCudaVersions=allowed, minCudaVersion="")
    else:
        gpu.update(allowedCudaVersions=[], minCudaVersion=desired.get("minCudaVersion") or "")
    return gpu


def patch_body(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``desired`` that ``current`` (the endpoint as RunPod shows it) does
    not have, as a ``PATCH /v2/serverless/{id}`` body; empty when they agree."""
    out = {key: desired.get(key) for key in _COMPARED if current.get(key) != desired.get(key)}
    if _gpu_key(current.get("gpu")) != _gpu_key(desired["gpu"]):
        out["gpu"] = _gpu_patch(desired["gpu"])
    return out


def request_urls(raw: Mapping[str, Any], name: str) -> EndpointUrls:
    """The endpoint's own request URLs from RunPod's answer (never built from its id)."""
    given = raw.get("requestUrls")
    urls: Mapping[str, Any] = given if isinstance(given, dict) else {}
    try:
        out = EndpointUrls.model_validate({key: urls.get(key) for key in URL_KEYS})
    except ValidationError:
        raise ProviderError(
            f"RunPod's answer for serverless endpoint {name} has no requestUrls "
            f"{'/'.join(URL_KEYS)} as http(s) URLs (is it queue-based?)"
        ) from None
    for key in URL_KEYS:
        problem = plain_http_problem(getattr(out, key), f"serverless endpoint {name}")
        if problem is not None:
            raise ProviderError(problem)
    return out


def _named(endpoints: Sequence[Mapping[str, Any]], name: str) -> list[Mapping[str, Any]]:
    """The endpoints called ``name``, oldest first."""
    found = [e for e in endpoints if e.get("name") == name and e.get("id")]
    return sorted(found, key=lambda e: str(e.get("createdAt") or ""))


class ServerlessEndpoints:
    """The serverless tiers' endpoints, kept as the settings say (see the module)."""

    def __init__(
        self,
        settings: RunPodSettings,
        fleet: str,
        tiers: Sequence[TierConfig],
        worker_env: Mapping[str, str],
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tiers = [t for t in tiers if t.serverless is not None]
        if self.tiers and (settings.api_key is None or not settings.api_key.get_secret_value()):
            raise ConfigError(
                f"tier {self.tiers[0].name} has a serverless endpoint the orchestrator "
                "manages: set the RunPod API key (FRAMERELAY_ORCH_RUNPOD__API_KEY or "
                "..._API_KEY_FILE)"
            )
        self.settings = settings
        self.fleet = fleet
        self.worker_env = dict(worker_env)
        self._http = RunPodHttp(settings, transport)
        self._clock = clock
        self._due = 0.0
        self.ready: dict[str, ManagedEndpoint] = {}
        """Tier name -> its endpoint, once RunPod answered for it."""
        self.problems: dict[str, str] = {}
        """Tier name -> why its endpoint could not be made or updated (last try)."""
        self.counters: Counter[str] = Counter()
        """``created``, ``updated``, ``taken`` (found as it should be), ``failed``."""

    async def tick(self) -> None:
        """Reconcile when due: at the first pass, each pass after a failure, then every
        :data:`RECHECK_S`. Never raises for RunPod's answers (``problems`` says)."""
        now = self._clock()
        if not self.tiers or now < self._due:
            return
        try:
            await self.reconcile()
        except ProviderError as exc:
            self.problems = {t.name: str(exc) for t in self.tiers}
        if self.problems:
            self.counters["failed"] += 1
            log.warning("serverless endpoints: %s", "; ".join(self.problems.values()))
        self._due = now if self.problems else now + RECHECK_S

    async def reconcile(self) -> dict[str, ManagedEndpoint]:
        """Create or update every serverless tier's endpoint; the ready ones."""
        existing = await self._http.pages("/serverless", "endpoints", "list serverless endpoints")
        pools = await self._pools()
        self.problems = {}
        for tier in self.tiers:
            try:
                self.ready[tier.name] = await self._keep(tier, pools, existing)
            except ProviderError as exc:
                self.problems[tier.name] = str(exc)
        return dict(self.ready)

    async def _pools(self) -> dict[str, str | None]:
        """GPU type -> its serverless pool, from RunPod's catalog."""
        gpus = await self._http.pages("/catalog/gpus", "gpus", "read RunPod's GPU catalog")
        out: dict[str, str | None] = {}
        for raw in gpus:
            pool = raw.get("pool")
            out[str(raw.get("id"))] = pool if isinstance(pool, str) and pool else None
        return out

    async def _keep(
        self,
        tier: TierConfig,
        pools: Mapping[str, str | None],
        existing: Sequence[Mapping[str, Any]],
    ) -> ManagedEndpoint:
        name = endpoint_name(self.fleet, tier.name)
        config = tier.serverless or ServerlessConfig()
        gpu = gpu_choice(tier, pools)
        body = endpoint_body(tier, config, self.settings, name, gpu, self.worker_env)
        found = _named(existing, name)
        if not found:
            raw = await self._create(name, body)
        else:
            raw = await self._update(name, found, body)
        return ManagedEndpoint(tier.name, name, str(raw["id"]), request_urls(raw, name))

    async def _update(
        self, name: str, found: Sequence[Mapping[str, Any]], body: Mapping[str, Any]
    ) -> Mapping[str, Any]:
        """The endpoint of ``name`` (the oldest of several), patched where it differs."""
        current = found[0]
        endpoint_id = str(current["id"])
        if len(found) > 1:
            others = ", ".join(str(e["id"]) for e in found[1:])
            log.warning(
                "RunPod has %d serverless endpoints named %s: %s is used; delete the others (%s)",
                len(found),
                name,
                endpoint_id,
                others,
            )
        if current.get("type", "QUEUE") != "QUEUE":
            raise ProviderError(
                f"RunPod serverless endpoint {name} ({endpoint_id}) is {current.get('type')}, "
                "not QUEUE: delete it, and the orchestrator makes a queue-based one"
            )
        patch = patch_body(current, body)
        if not patch:
            self.counters["taken"] += 1
            return current
        resp = await self._http.call("PATCH", f"/serverless/{endpoint_id}", body=patch)
        check(resp, f"update serverless endpoint {name} ({endpoint_id})")
        self.counters["updated"] += 1
        log.info(
            "updated RunPod serverless endpoint %s (%s): %s",
            name,
            endpoint_id,
            ", ".join(sorted(patch)),
        )
        answer: Mapping[str, Any] = json_body(resp, "PATCH /serverless/{id}")
        return answer

    async def _create(self, name: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """``POST /v2/serverless`` once at a time; after an answer that may be lost, the
        endpoint of that name is looked up and taken before another create is sent."""
        what = f"serverless endpoint {name}"
        got = await self._http.create_once("/serverless", body, what, lambda: self._find(name))
        raw: Mapping[str, Any] = got if not isinstance(got, httpx.Response) else {}
        if isinstance(got, httpx.Response):
            if got.status_code not in (200, 201):
                raise refusal(got, f"create {what}")
            raw = json_body(got, "POST /serverless")
            log.info("created RunPod serverless endpoint %s (%s)", name, raw.get("id"))
        self.counters["created"] += 1
        return raw

    async def _find(self, name: str) -> Mapping[str, Any] | None:
        endpoints = await self._http.pages("/serverless", "endpoints", f"look up {name}")
        found = _named(endpoints, name)
        return found[0] if found else None

    async def aclose(self) -> None:
        await self._http.aclose()
