"""The provider contract: create, get, list, stop, terminate, price list.

Implementations: ``local`` (worker processes on this machine), ``runpod``
(RunPod REST API v2, :mod:`deploy.providers.runpod`), ``kubernetes`` (Deployments +
Services). Errors form a small tree so the orchestrator can tell "try elsewhere" from
"stop and fix".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from deploy.models import PodInfo, PodSpec
from framerelay.errors import FramerelayError


class ProviderError(FramerelayError):
    """A provider call failed for good (after retries); the message says why."""


class NoCapacityError(ProviderError):
    """No GPU of any allowed type / cloud / data centre is available right now."""


@dataclass(frozen=True, slots=True)
class GpuPrice:
    """$/hour of one GPU of a type, per cloud and kind. A provider without spot
    capacity (RunPod's API v2) leaves the spot prices out: a spot price asked of it is
    the cloud's own."""

    gpu_type: str
    secure: float
    community: float
    secure_spot: float | None = None
    community_spot: float | None = None
    serverless: float | None = None
    """RunPod's serverless list price of one GPU of the type (its pool), when it sells one."""

    def price(self, cloud_type: str, spot: bool) -> float:
        if cloud_type == "COMMUNITY":
            spot_price, price = self.community_spot, self.community
        else:
            spot_price, price = self.secure_spot, self.secure
        return spot_price if spot and spot_price is not None else price

    @property
    def ondemand(self) -> float:
        """The on-demand reference price (secure cloud)."""
        return self.secure


class Provider(Protocol):
    name: str

    async def create(self, spec: PodSpec) -> PodInfo:
        """Create a pod; raises NoCapacityError or ProviderError."""
        ...

    async def get(self, pod_id: str) -> PodInfo | None:
        """The pod, or None when it no longer exists."""
        ...

    async def list(self) -> list[PodInfo]:
        """Every pod of this account / namespace / machine."""
        ...

    async def stop(self, pod_id: str) -> None: ...

    async def terminate(self, pod_id: str) -> None:
        """Delete the pod; a pod already gone is not an error."""
        ...

    async def prices(self) -> dict[str, GpuPrice]: ...

    async def aclose(self) -> None: ...
