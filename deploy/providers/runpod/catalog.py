"""RunPod's GPU catalog, and which GPU type, cloud and data centres a create asks for.

``GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&cloud=<cloud>&count=<gpus>``
(with ``minCudaVersion``, or ``cudaVersions``, as the settings constrain the host) says
per GPU type its VRAM (``memory``), the clouds it is sold on, its list price per cloud
(``price.secure``, ``price.community``, ``price.serverless``), its stock for that cloud
and GPU count (``availability``: NONE, LOW, MEDIUM, HIGH), its stock per data centre
(``dataCenters``) and the CUDA versions its hosts run (``cudaVersions``, each
``available`` or full). One read per (cloud, GPU count), reused for ``catalog_ttl_s``;
a create RunPod refuses for capacity marks that type sold out there until the next read.

**The choice** (:func:`candidates`): of the tier's GPU types (sizing's order, those too
small for its models already left out) and the clouds it allows, only those the
catalog sells on that cloud, with at least the tier's VRAM need, a host CUDA the
settings accept and stock in a data centre the pod may use (the tier's
``data_centers``, or its network volume's one) are candidates. They go cheapest first:
a pod's list price (one GPU's price on that cloud times ``gpu_count``) per fps of the
tier's models where sizing measured them, else per hour; ties keep the tier's order
of GPU types, then of clouds. A data centre and cloud where a pod never became
reachable is *deprioritised* (:mod:`deploy.providers.runpod.provider`): candidates
there come after all the others. Nothing is created blind: no candidate, no
``POST /pods`` (:class:`deploy.providers.base.NoCapacityError` says why each option
was left out).

The price the fleet accounts for a running pod is its own ``cost``, not this list
price (:mod:`deploy.providers.runpod.pods`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from deploy.models import PodSpec
from deploy.providers.base import GpuPrice
from deploy.providers.runpod.client import RunPodHttp
from deploy.settings import RunPodSettings

log = logging.getLogger(__name__)
_STOCK = {"HIGH": 0, "MEDIUM": 1, "LOW": 2}
"""Availability levels with stock, best first (NONE has none)."""
Avoided = Callable[[str, str], bool]
"""(data centre, cloud) -> deprioritised now? ("" when RunPod did not say where.)"""


def _float(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


def _version(text: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class GpuOffer:
    """One GPU type as the catalog sells it on one cloud, for one GPU count."""

    gpu_type: str
    memory_gb: float
    price: GpuPrice
    clouds: frozenset[str]
    """The clouds it is sold on (``SECURE``, ``COMMUNITY``)."""
    stock: str
    centres: tuple[tuple[str, str], ...] = ()
    """(data centre, availability) as listed; empty when the catalog lists none."""
    cuda_ok: bool = True
    """A host CUDA version the settings accept has room (or the catalog lists none)."""

    def sold_out(self) -> GpuOffer:
        return dataclasses.replace(self, stock="NONE", centres=())


def cuda_accepts(settings: RunPodSettings, version: str) -> bool:
    """Whether a host of CUDA ``version`` may run the worker image."""
    if settings.allowed_cuda_versions:
        return version in settings.allowed_cuda_versions
    if settings.min_cuda_version is None:
        return True
    have, floor = _version(version), _version(settings.min_cuda_version)
    return have is not None and floor is not None and have >= floor


def parse_offer(raw: Mapping[str, Any], settings: RunPodSettings) -> GpuOffer | None:
    """A ``GpuType`` of the catalog's list (None: not one)."""
    gpu = raw.get("id")
    if not isinstance(gpu, str) or not gpu:
        return None
    listed = raw.get("price")
    prices: Mapping[str, Any] = listed if isinstance(listed, dict) else {}
    serverless = prices.get("serverless")
    price = GpuPrice(
        gpu,
        _float(prices.get("secure")),
        _float(prices.get("community")),
        serverless=_float(serverless) if serverless is not None else None,
    )
    centres = tuple(
        (str(dc["id"]), str(dc.get("availability")))
        for dc in raw.get("dataCenters") or []
        if isinstance(dc, dict) and dc.get("id")
    )
    versions = [v for v in raw.get("cudaVersions") or [] if isinstance(v, dict)]
    cuda_ok = not versions or any(
        v.get("available") is True and cuda_accepts(settings, str(v.get("version")))
        for v in versions
    )
    clouds = frozenset(c for c in ("SECURE", "COMMUNITY") if raw.get(c.lower()) is True)
    stock = str(raw.get("availability") or "NONE")
    return GpuOffer(gpu, _float(raw.get("memory")), price, clouds, stock, centres, cuda_ok)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One create to try: a GPU type on a cloud, in these data centres."""

    gpu_type: str
    cloud: str
    centres: tuple[str, ...]
    """``dataCenterIds`` to send; empty: RunPod's scheduler picks."""
    usd_per_hr: float
    """The pod's list price (one GPU's times the GPU count)."""
    deprioritised: bool = False

    @property
    def where(self) -> str:
        return f"{self.gpu_type}/{self.cloud}" + (
            f"/{','.join(self.centres)}" if self.centres else ""
        )


def _unfit(offer: GpuOffer | None, cloud: str, spec: PodSpec) -> str | None:
    """Why the offer cannot take the pod (None: it can, stock per data centre aside)."""
    if offer is None:
        return "not in RunPod's catalog"
    if cloud not in offer.clouds:
        return f"not sold on the {cloud} cloud"
    if offer.memory_gb < spec.min_vram_gb:
        return f"{offer.memory_gb:g} GB VRAM < {spec.min_vram_gb:g} GB for the tier's models"
    if offer.stock not in _STOCK:
        return f"no stock ({offer.stock})"
    if not offer.cuda_ok:
        return "no room on a host with the CUDA the worker image needs"
    return None


def _centres(
    offer: GpuOffer, spec: PodSpec, centre: str | None, avoided: Avoided, cloud: str
) -> list[tuple[tuple[str, ...], bool]] | str:
    """The data centres to ask for, as (centres, deprioritised) variants; a reason
    when none of those the pod may use has stock."""
    allowed = (centre,) if centre else spec.data_centers
    if offer.centres:
        usable = [
            (dc, lvl)
            for dc, lvl in offer.centres
            if lvl in _STOCK and (not allowed or dc in allowed)
        ]
        usable.sort(key=lambda e: (allowed.index(e[0]) if allowed else 0, _STOCK[e[1]]))
        stocked = [dc for dc, _ in usable]
        if not stocked:
            return f"no stock in {', '.join(allowed) if allowed else 'any data centre'}"
    else:
        stocked = list(allowed)
    if not stocked:
        return [((), avoided("", cloud))]
    good = tuple(dc for dc in stocked if not avoided(dc, cloud))
    bad = tuple(dc for dc in stocked if avoided(dc, cloud))
    return [(dcs, late) for dcs, late in ((good, False), (bad, True)) if dcs]


def candidates(
    spec: PodSpec,
    offers: Mapping[str, Mapping[str, GpuOffer]],
    centre: str | None,
    avoided: Avoided,
) -> tuple[list[Candidate], list[str]]:
    """The creates to try, best first, and why each other option was left out.
    ``offers``: cloud -> GPU type -> offer; ``centre``: the network volume's data centre."""
    ranked: list[tuple[tuple[bool, bool, float, int, int], Candidate]] = []
    left_out: list[str] = []
    for gi, gpu in enumerate(spec.gpu_types):
        for ci, cloud in enumerate(spec.cloud_types):
            offer = offers.get(cloud, {}).get(gpu)
            why = _unfit(offer, cloud, spec)
            if offer is None or why is not None:
                left_out.append(f"{gpu}/{cloud}: {why}")
                continue
            variants = _centres(offer, spec, centre, avoided, cloud)
            if isinstance(variants, str):
                left_out.append(f"{gpu}/{cloud}: {variants}")
                continue
            usd = offer.price.price(cloud, False) * spec.gpu_count
            fps = spec.gpu_fps.get(gpu)
            unit = usd / fps if fps else usd
            for dcs, late in variants:
                key = (late, not fps, unit, gi, ci)
                ranked.append((key, Candidate(gpu, cloud, dcs, usd, late)))
    ranked.sort(key=lambda pair: pair[0])
    return [c for _, c in ranked], left_out


class Catalog:
    """The catalog as last read, per (cloud, GPU count), for ``catalog_ttl_s``."""

    def __init__(self, http: RunPodHttp, settings: RunPodSettings, clock: Callable[[], float]):
        self._http = http
        self._settings = settings
        self._clock = clock
        self._read: dict[tuple[str, int], tuple[float, dict[str, GpuOffer]]] = {}
        self.reads = 0
        """Catalog requests sent (each answer is reused for catalog_ttl_s)."""

    def _params(self, cloud: str, count: int) -> dict[str, str]:
        params = {
            "include": "AVAILABILITY",
            "product": "POD",
            "cloud": cloud,
            "count": str(count),
        }
        cuda = self._settings.cuda
        if "allowedCudaVersions" in cuda:
            params["cudaVersions"] = ",".join(self._settings.allowed_cuda_versions)
        elif self._settings.min_cuda_version:
            params["minCudaVersion"] = self._settings.min_cuda_version
        return params

    async def offers(self, cloud: str, count: int) -> dict[str, GpuOffer]:
        """GPU type -> offer on ``cloud`` for ``count`` GPUs (read again when stale)."""
        now = self._clock()
        read = self._read.get((cloud, count))
        if read is not None and now - read[0] < self._settings.catalog_ttl_s:
            return read[1]
        raw = await self._http.pages(
            "/catalog/gpus", "gpus", "read the GPU catalog", self._params(cloud, count)
        )
        self.reads += 1
        parsed = (parse_offer(g, self._settings) for g in raw)
        offers = {o.gpu_type: o for o in parsed if o is not None}
        self._read[(cloud, count)] = (now, offers)
        return offers

    async def candidates(
        self, spec: PodSpec, centre: str | None, avoided: Avoided
    ) -> tuple[list[Candidate], list[str]]:
        """:func:`candidates` of the pod, from the catalog (read when stale)."""
        offers = {c: await self.offers(c, spec.gpu_count) for c in dict.fromkeys(spec.cloud_types)}
        return candidates(spec, offers, centre, avoided)

    def sold_out(self, cand: Candidate, count: int) -> None:
        """RunPod refused a create there for capacity: no stock until the next read."""
        read = self._read.get((cand.cloud, count))
        offer = read[1].get(cand.gpu_type) if read is not None else None
        if read is not None and offer is not None:
            read[1][cand.gpu_type] = offer.sold_out()

    async def prices(self) -> dict[str, GpuPrice]:
        """List prices per GPU type (read with the secure cloud's stock when none is fresh)."""
        now = self._clock()
        if all(now - t >= self._settings.catalog_ttl_s for t, _ in self._read.values()):
            await self.offers("SECURE", 1)
        return self.known_prices()

    def known_prices(self) -> dict[str, GpuPrice]:
        """List prices per GPU type as last read (none before the first read)."""
        return {gpu: o.price for _, offers in self._read.values() for gpu, o in offers.items()}
