"""The RunPod provider (:class:`RunPodProvider`): pods through RunPod's REST API v2.

Calls: ``POST /v2/pods`` (create), ``GET /v2/pods/{id}``, ``GET /v2/pods`` (every
page), ``POST /v2/pods/{id}/action`` (``stop``, ``start``, ``terminate``),
``GET /v2/catalog/gpus`` (:mod:`deploy.providers.runpod.catalog`) and
``GET /v2/network-volumes/{id}`` (where a tier's volume is, asked once).

**Create** asks the catalog for candidates first and sends nothing when none has
stock (:class:`NoCapacityError` with each option's reason). Candidates are tried in
order: RunPod's ``400`` (no capacity, or a rule that candidate breaks) and ``403``
(the account cannot use that pool) move on to the next; ``402``, ``422`` and ``401``
stop (the balance, a refused field, the key). A create is **idempotent**: it carries
the pod's name, unique per intent (``<fleet>-<tier>-<slot>-g<generation>``), and after
a 5xx or a lost answer (RunPod has been seen to answer 500 after creating the pod)
the provider lists the pods and takes the one of that name before it sends the
create again: at most one pod per create is billed. When even that cannot be told,
the fleet keeps the intent and adopts the pod by name on a later pass.

**Unreachable pods fail fast**: a pod RUNNING for ``unreachable_grace_s`` (90 s) with
no public IP and port for one of its worker ports (community hosts may have no public
IP) is reported :attr:`PodStatus.ERROR` with the reason, and the fleet terminates and
replaces it at once; its data centre and cloud are tried last for ``avoid_s``. A pod
RunPod reports in ``ERROR`` is reported the same way (replaced at once).

The pod's env carries what :mod:`deploy.pod_trust` gives it: the public key set, and
with ``tls`` (the default) its own certificate and key; its tunnel is then ``wss://``
and verified as ``<pod>.pods.framerelay``. A tier's ``volume`` (a RunPod network
volume) is mounted as ``mounts.network`` in the volume's own data centre, and its
workers keep their artefact cache there (:class:`deploy.settings.TierVolume`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from deploy.models import PodInfo, PodSpec, PodStatus
from deploy.providers.base import GpuPrice, NoCapacityError, ProviderError
from deploy.providers.runpod.catalog import Candidate, Catalog
from deploy.providers.runpod.client import (
    Problem,
    RunPodHttp,
    check,
    json_body,
    one_line,
    refusal,
)
from deploy.providers.runpod.pods import (
    create_body,
    pod_info,
    public_mappings,
    uptime,
    worker_ports,
)
from deploy.settings import VOLUME_ENV, RunPodSettings
from framerelay.errors import ConfigError

log = logging.getLogger(__name__)
_CAPACITY_WORDS = (
    "capacity",
    "no longer any",
    "no instances",
    "not available",
    "unavailable",
    "could not be placed",
    "not enough",
    "no machine",
    "stock",
)
_NEXT_CANDIDATE = frozenset({400, 403})
"""Answers to a create that another candidate may not get (RunPod's own advice)."""


@dataclass(frozen=True, slots=True)
class Refused:
    """A candidate RunPod refused: where, its problem line, and whether for capacity."""

    where: str
    line: str
    capacity: bool


class RunPodProvider:
    name = "runpod"

    def __init__(
        self,
        settings: RunPodSettings,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if settings.api_key is None or not settings.api_key.get_secret_value():
            raise ConfigError(
                "the runpod provider needs an API key: set FRAMERELAY_ORCH_RUNPOD__API_KEY"
            )
        self.settings = settings
        self._http = RunPodHttp(settings, transport)
        self._catalog = Catalog(self._http, settings, clock)
        self._clock = clock
        self._volume_centres: dict[str, str] = {}
        self._avoid: dict[tuple[str, str], float] = {}
        """(data centre, cloud) -> tried last until this time (an unreachable pod's host)."""
        self._unreachable_since: dict[str, float] = {}
        """Pod id -> when it was first seen RUNNING without a public address."""

    @property
    def retries(self) -> int:
        """Requests sent again after a transient failure."""
        return self._http.retries

    @property
    def catalog(self) -> Catalog:
        return self._catalog

    # -- create ------------------------------------------------------------------

    async def create(self, spec: PodSpec) -> PodInfo:
        if spec.spot:
            raise ProviderError(
                f"tier {spec.tier} asks for a spot pod: RunPod has no spot (interruptible) "
                'pods: give the tier "interruptible": false and "cloud_types": ["COMMUNITY"]'
            )
        centre = await self._volume_centre(spec)
        cands, left_out = await self._catalog.candidates(spec, centre, self._avoided)
        if not cands:
            raise NoCapacityError(
                one_line(
                    f"no stock for {spec.name} in RunPod's catalog, nothing created: "
                    + "; ".join(left_out),
                    500,
                )
            )
        refused: list[Refused] = []
        for cand in cands:
            got = await self._create_on(spec, cand)
            if isinstance(got, PodInfo):
                return got
            refused.append(got)
            log.info("RunPod refused %s on %s (%s); next option", spec.name, got.where, got.line)
        raise self._refused_everywhere(spec, refused)

    def _refused_everywhere(self, spec: PodSpec, refused: Sequence[Refused]) -> ProviderError:
        said = "; ".join(f"{r.where}: {r.line}" for r in refused)
        if any(r.capacity for r in refused):
            return NoCapacityError(one_line(f"no capacity for {spec.name} (tried {said})", 500))
        return ProviderError(
            one_line(
                f"RunPod refused to create {spec.name} on every option ({said}): the "
                "request, not stock: check the tier's template, volume, image and "
                "registry",
                500,
            )
        )

    async def _create_on(self, spec: PodSpec, cand: Candidate) -> PodInfo | Refused:
        """One candidate: the created (or found) pod, or why RunPod refused it."""
        body = create_body(spec, cand, self.settings, self._volume(spec))
        what = f"pod {spec.name} on {cand.where}"
        got = await self._http.create_once("/pods", body, what, lambda: self._find(spec.name))
        return got if isinstance(got, PodInfo) else self._created(got, spec, cand)

    def _created(self, resp: httpx.Response, spec: PodSpec, cand: Candidate) -> PodInfo | Refused:
        if resp.status_code in (200, 201):
            info = self._info(json_body(resp, "POST /pods"), spec.ports)
            log.info(
                "created pod %s (%s) on %s at $%.3f/h list price",
                spec.name,
                info.id,
                cand.where,
                cand.usd_per_hr,
            )
            return info
        if resp.status_code not in _NEXT_CANDIDATE:
            raise refusal(resp, f"create pod {spec.name} on {cand.where}")
        line = Problem.of(resp).line()
        capacity = resp.status_code == 400 and any(w in line.lower() for w in _CAPACITY_WORDS)
        if capacity:
            self._catalog.sold_out(cand, spec.gpu_count)
        return Refused(cand.where, line, capacity)

    async def _find(self, name: str) -> PodInfo | None:
        """The live pod called ``name`` (a create that may have happened), else None."""
        for raw in await self._http.pages("/pods", "pods", f"look up pod {name}"):
            if raw.get("name") == name and raw.get("status") != "TERMINATED":
                return self._info(raw, None)
        return None

    # -- volumes -----------------------------------------------------------------

    async def _volume_centre(self, spec: PodSpec) -> str | None:
        """The data centre of the pod's network volume: the tier's setting, else RunPod's
        word (``GET /network-volumes/{id}``, asked once per volume)."""
        volume_id = self._volume(spec)[0]
        if not volume_id:
            return None
        tier = self.settings.volume_for(spec.tier)
        said = tier.data_center if tier is not None and tier.runpod_id == volume_id else None
        centre = said or self._volume_centres.get(volume_id)
        if centre is None:
            resp = await self._http.call("GET", f"/network-volumes/{volume_id}")
            check(resp, f"find network volume {volume_id}")
            body = json_body(resp, "GET /network-volumes/{id}")
            where = body.get("dataCenter") if isinstance(body, dict) else None
            if not isinstance(where, str) or not where:
                raise ProviderError(
                    f"RunPod did not say where network volume {volume_id} is (no dataCenter)"
                )
            centre = self._volume_centres[volume_id] = where
        if spec.data_centers and centre not in spec.data_centers:
            raise ProviderError(
                f"tier {spec.tier}: network volume {volume_id} is in {centre}, not in "
                f"its data_centers {list(spec.data_centers)}; a pod mounts a network volume "
                "only in the volume's data centre"
            )
        return centre

    def _volume(self, spec: PodSpec) -> tuple[str | None, str, dict[str, str]]:
        """(network volume id, mount path, the worker env it brings): the tier's volume,
        else the pod's or the provider's ``network_volume_id``."""
        tier = self.settings.volume_for(spec.tier)
        if tier is not None and tier.runpod_id:
            return tier.runpod_id, tier.mount_path, tier.worker_env(tier.mount_path)
        volume = spec.network_volume_id or self.settings.network_volume_id
        mount = self.settings.volume_mount_path
        return volume, mount, {VOLUME_ENV: mount} if volume else {}

    # -- pods --------------------------------------------------------------------

    async def get(self, pod_id: str) -> PodInfo | None:
        resp = await self._http.call("GET", f"/pods/{pod_id}")
        if resp.status_code == 404:
            return None
        check(resp, f"get pod {pod_id}")
        return self._info(json_body(resp, "GET /pods/{id}"), None)

    async def list(self) -> list[PodInfo]:
        pods = [
            self._info(raw, None) for raw in await self._http.pages("/pods", "pods", "list pods")
        ]
        seen = {p.id for p in pods}
        for gone in [i for i in self._unreachable_since if i not in seen]:
            del self._unreachable_since[gone]
        return pods

    async def stop(self, pod_id: str) -> None:
        await self._action(pod_id, "stop", missing_ok=True)

    async def start(self, pod_id: str) -> None:
        await self._action(pod_id, "start", missing_ok=False)

    async def terminate(self, pod_id: str) -> None:
        await self._action(pod_id, "terminate", missing_ok=True)

    async def _action(self, pod_id: str, action: str, *, missing_ok: bool) -> None:
        """``POST /pods/{id}/action``; a pod already gone is fine where ``missing_ok``."""
        resp = await self._http.call("POST", f"/pods/{pod_id}/action", body={"action": action})
        if resp.status_code == 404 and missing_ok:
            return
        check(resp, f"{action} pod {pod_id}")

    async def prices(self) -> dict[str, GpuPrice]:
        """List prices per GPU type, from the catalog (the last known when it cannot be read)."""
        try:
            return await self._catalog.prices()
        except ProviderError as exc:
            log.warning("RunPod's catalog could not be read for prices: %s", exc)
            return self._catalog.known_prices()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- reachability ----------------------------------------------------------------

    def _info(self, raw: Mapping[str, Any], ports: Sequence[int] | None) -> PodInfo:
        ports = list(ports) if ports else worker_ports(raw)
        info = pod_info(raw, ports, self.settings.tls)
        if raw.get("status") == "RUNNING" and not info.endpoints:
            self._unreachable(info, raw, ports)
        else:
            self._unreachable_since.pop(info.id, None)
        return info

    def _unreachable(self, info: PodInfo, raw: Mapping[str, Any], ports: Sequence[int]) -> None:
        """A RUNNING pod without a public address: ERROR once past the grace (and its data
        centre and cloud tried last for ``avoid_s``)."""
        now = self._clock()
        since = self._unreachable_since.setdefault(info.id, now - (uptime(raw) or 0.0))
        waited = now - since
        if waited < self.settings.unreachable_grace_s:
            return
        missing = [f"{p}/tcp" for p in ports if p not in public_mappings(raw, ports)]
        where = f"{info.data_center or 'an unknown data centre'}/{info.cloud_type or '?'}"
        first = (info.data_center, info.cloud_type) not in self._avoid
        self._avoid[(info.data_center, info.cloud_type)] = now + self.settings.avoid_s
        info.status = PodStatus.ERROR
        info.reason = one_line(
            f"RUNNING {waited:.0f} s with no public IP and port for {', '.join(missing)} "
            f"(unreachable from the orchestrator) in {where}: replaced; {where} is tried "
            f"last for {self.settings.avoid_s:.0f} s"
        )
        if first:
            log.warning("pod %s (%s): %s", info.name, info.id, info.reason)

    def _avoided(self, centre: str, cloud: str) -> bool:
        """Whether ``centre``/``cloud`` is deprioritised now ("": any data centre of it)."""
        now = self._clock()
        for key in [k for k, until in self._avoid.items() if until <= now]:
            del self._avoid[key]
        if centre:
            return (centre, cloud) in self._avoid
        return any(c == cloud for _, c in self._avoid)
