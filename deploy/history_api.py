"""``GET /v1/history`` and ``GET /v1/events`` of the orchestrator (scope ``fleet:read``).

* ``/v1/history``: the last hour of the fleet's cost and size, a point every
  10 s (:mod:`deploy.history`);
* ``/v1/events?since=<unix time>``: the fleet's events after that time, oldest
  first (:mod:`deploy.events`); ``since`` must be a finite number (NaN,
  Infinity or ``1e400`` are a 422). A client polls with the ``t`` of the last
  event it has (or uses ``seq`` to skip those it has seen).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from deploy.history import FleetHistoryView
from deploy.service import Orchestrator
from framerelay.auth.web import AuthFirstRoute


class FleetEvent(BaseModel):
    """One fleet event; kinds may add fields (``tier``, ``spot``, ``error``, ``old``, ...)."""

    model_config = ConfigDict(extra="allow")

    seq: int = Field(description="1, 2, ... in this orchestrator process.")
    t: float = Field(description="Unix time.")
    kind: str = Field(description="created, replaced, preempted, unhealthy, moved, ...")
    pod: str = Field(description="The pod ('' for none); for moved, the new worker.")
    stream: str | None = Field(description="The stream, for a stream's event.")
    reason: str = Field(description="Why, in one line.")


class FleetEvents(BaseModel):
    model_config = ConfigDict(extra="forbid")

    events: list[FleetEvent] = Field(description="Oldest first.")
    kept: int = Field(description="The most events the log keeps (older ones are gone).")


Since = Annotated[
    float | None,
    Query(allow_inf_nan=False, ge=0, description="Only events after this Unix time."),
]


def history_router(orch: Orchestrator, read: Any) -> APIRouter:
    """The two routes; ``read``: the dependency checking ``fleet:read``."""
    router = APIRouter(route_class=AuthFirstRoute, tags=["fleet"], dependencies=[read])

    @router.get("/v1/history", summary="The last hour of cost and fleet size")
    async def history() -> FleetHistoryView:
        """A point every 10 s over the last hour: $/h of the fleet (and on on-demand), $/h
        per placed stream, streams placed, billed pods per tier."""
        return orch.history.read()

    @router.get("/v1/events", summary="The fleet's event log")
    async def events(since: Since = None) -> FleetEvents:
        """Pods created, ready, unhealthy, replaced, preempted, terminated; streams placed,
        re-homed, moved: each with its time, pod, stream and reason (the newest 500)."""
        log = orch.fleet.events
        return FleetEvents.model_validate({"events": log.since(since), "kept": log.size})

    return router
