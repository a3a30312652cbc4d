"""The console's fleet panel: ``GET /v1/console/fleet`` (``streams:read``).

What the orchestrator (``FRAMERELAY_INGEST_ORCHESTRATOR_URL``, read over HTTP by
:mod:`ingest.orchestrator_client`) says about the GPU fleet, compacted for the
page: pods (provider, tier, GPU, state, canary latency, uptime, $/h), cost now
and so far (per stream-hour, saving against all on-demand), the last
:data:`EVENTS` fleet events and the last hour of $/h for a chart. Without an
orchestrator the answer is ``{"configured": false}``.

One :class:`FleetFeed` serves every console: it asks the orchestrator at most
once per :data:`REFRESH_S` (``/v1/fleet``, ``/v1/events?since=`` for the events
after the newest it holds, ``/v1/history`` every :data:`HISTORY_EVERY_S`), only
while someone reads the panel, and answers everyone else from the last answer.
When the orchestrator fails (unreachable, timed out, refused the token, sent
something unreadable) the panel keeps the last good data, says how old it is
(``age_s``, ``stale: true``) and why (``error``: one line, never a secret).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

from framerelay.auth.web import ApiAuth, AuthFirstRoute
from ingest.console_feed import REFRESH_S, OrchestratorFeed, panel_response
from ingest.orchestrator_client import OrchestratorClient, Request
from ingest.settings import IngestSettings

log = logging.getLogger(__name__)
HISTORY_EVERY_S = 10.0
"""``/v1/history`` gains a point every 10 s: asked this often."""
EVENTS = 50
EVENT_OVERLAP_S = 1.0
"""``since`` reaches this far behind the newest event held (duplicates are dropped)."""
TEXT_CHARS = 300
MAX_ITEMS = 10_000
"""Pods, events or history points in one answer of the orchestrator, at most."""


# -- what the ingest reads of the orchestrator's answers (other fields are ignored) --------


class _Upstream(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class _Pod(_Upstream):
    name: str
    tier: str = ""
    spot: bool = False
    state: str = ""
    ready: bool = False
    gpu_type: str = ""
    provider_id: str | None = None
    cost_per_hr: float = 0.0
    ondemand_per_hr: float = 0.0
    canary_ms: float | None = None
    uptime_s: float | None = None
    streams: list[str] = Field(default_factory=list, max_length=MAX_ITEMS)
    last_error: str | None = None
    provider_reason: str | None = None


class _Cost(_Upstream):
    fleet_usd: float = 0.0
    ondemand_equiv_usd: float = 0.0
    saving_vs_ondemand: float = 0.0
    stream_hours: float = 0.0
    cost_per_stream_hour_usd: float = 0.0
    burn_usd_per_hr: float = 0.0


class _Fleet(_Upstream):
    provider: str = ""
    pods: list[_Pod] = Field(default_factory=list, max_length=MAX_ITEMS)
    cost: _Cost = Field(default_factory=_Cost)


class _Event(_Upstream):
    seq: int = 0
    t: float
    kind: str
    pod: str = ""
    stream: str | None = None
    reason: str = ""


class _Events(_Upstream):
    events: list[_Event] = Field(max_length=MAX_ITEMS)


Points = list[float | None]


class _History(_Upstream):
    interval_s: float = 10.0
    timestamps: list[float] = Field(max_length=MAX_ITEMS)
    usd_per_hour: Points = Field(max_length=MAX_ITEMS)
    ondemand_usd_per_hour: Points = Field(max_length=MAX_ITEMS)
    usd_per_stream_hour: Points = Field(max_length=MAX_ITEMS)


# -- what the page gets ----------------------------------------------------------------------


class FleetPod(BaseModel):
    """One GPU worker of the fleet."""

    name: str
    provider: str = Field(description="local, runpod or kubernetes.")
    tier: str
    spot: bool
    gpu: str = Field(description="The GPU type the provider gave ('' until known).")
    state: str = Field(description="creating, running, draining or gone.")
    ready: bool = Field(description="Passed its canary inference; takes streams.")
    canary_ms: float | None = Field(
        description="Round trip of its last passed canary inference (null: none yet)."
    )
    uptime_s: float | None = Field(description="Since the orchestrator created it.")
    usd_per_hr: float = Field(description="What it costs per hour.")
    streams: list[str] = Field(description="The streams placed on it.")
    error: str | None = Field(
        description="Its last health problem, else why its provider has not started it "
        "(e.g. Kubernetes' 'Unschedulable: ...'), if any."
    )


class FleetCost(BaseModel):
    """Cost now (the pods billed this moment) and so far (since the orchestrator began)."""

    usd_per_hr: float = Field(description="What the fleet costs per hour now ($/h).")
    ondemand_usd_per_hr: float = Field(description="The same pods on on-demand ($/h).")
    savings_usd_per_hr: float = Field(description="ondemand_usd_per_hr - usd_per_hr.")
    savings_pct: float | None = Field(description="The saving in % (null: nothing billed).")
    streams_placed: int = Field(description="Streams running on a pod.")
    usd_per_stream_hr: float | None = Field(
        description="usd_per_hr / streams_placed (null: no stream placed)."
    )
    total_usd: float = Field(description="The fleet's cost so far ($).")
    total_savings_pct: float | None = Field(
        description="Saved so far against the same capacity on on-demand, in %."
    )
    total_usd_per_stream_hr: float | None = Field(
        description="Cost so far per stream-hour served (null: none served)."
    )
    stream_hours: float = Field(description="Stream-hours served so far.")


class FleetEvent(BaseModel):
    t: float = Field(description="Unix time (the orchestrator's clock).")
    kind: str = Field(description="created, ready, unhealthy, replaced, preempted, moved, ...")
    pod: str = Field(description="The pod ('' for none); for moved, the new worker.")
    stream: str | None = Field(description="The stream, for a stream's event.")
    reason: str = Field(description="Why, in one line.")


class FleetChart(BaseModel):
    """The last hour, a point every ``interval_s``, oldest first (null: no value then)."""

    interval_s: float
    t: list[float] = Field(description="Unix time of each point.")
    usd_per_hr: Points
    ondemand_usd_per_hr: Points
    usd_per_stream_hr: Points


class FleetPanel(BaseModel):
    """The fleet panel; without an orchestrator only ``{"configured": false}``."""

    configured: bool = Field(description="An orchestrator is configured.")
    orchestrator: str | None = Field(None, description="Its URL.")
    fetched_at: float | None = Field(None, description="Unix time of the data shown.")
    age_s: float | None = Field(None, description="How old the data shown is.")
    stale: bool = Field(False, description="The last refresh failed: older data shown.")
    error: str | None = Field(None, description="Why the last refresh failed, in one line.")
    provider: str | None = None
    pods: list[FleetPod] = Field(default_factory=list)
    cost: FleetCost | None = None
    events: list[FleetEvent] = Field(
        default_factory=list, description=f"The newest {EVENTS}, oldest first."
    )
    history: FleetChart | None = None


def _text(value: str | None) -> str:
    """One printable line of at most :data:`TEXT_CHARS` (upstream text is not trusted)."""
    line = " ".join((value or "").split())
    return "".join(c for c in line if c.isprintable())[:TEXT_CHARS]


def _pod(pod: _Pod, provider: str) -> FleetPod:
    problem = pod.last_error or pod.provider_reason
    return FleetPod(
        name=_text(pod.name),
        provider=provider,
        tier=_text(pod.tier),
        spot=pod.spot,
        gpu=_text(pod.gpu_type),
        state=_text(pod.state),
        ready=pod.ready,
        canary_ms=pod.canary_ms,
        uptime_s=pod.uptime_s,
        usd_per_hr=round(pod.cost_per_hr, 4),
        streams=[_text(s) for s in pod.streams],
        error=_text(problem) if problem else None,
    )


def _pct(part: float, whole: float) -> float | None:
    return round(100 * part / whole, 2) if whole > 0 else None


def _cost(fleet: _Fleet) -> FleetCost:
    """Now: from the pods the provider bills (as the orchestrator's history samples them);
    so far: the orchestrator's totals."""
    billed = [p for p in fleet.pods if p.provider_id is not None]
    burn = fleet.cost.burn_usd_per_hr
    ondemand = sum(max(p.ondemand_per_hr, p.cost_per_hr) for p in billed)
    placed = sum(len(p.streams) for p in fleet.pods)
    total = fleet.cost
    return FleetCost(
        usd_per_hr=round(burn, 4), ondemand_usd_per_hr=round(ondemand, 4),
        savings_usd_per_hr=round(ondemand - burn, 4), savings_pct=_pct(ondemand - burn, ondemand),
        streams_placed=placed, usd_per_stream_hr=round(burn / placed, 4) if placed else None,
        total_usd=round(total.fleet_usd, 4),
        total_savings_pct=round(100 * total.saving_vs_ondemand, 2)
        if total.ondemand_equiv_usd > 0 else None,
        total_usd_per_stream_hr=round(total.cost_per_stream_hour_usd, 4)
        if total.stream_hours > 0 else None,
        stream_hours=round(total.stream_hours, 4),
    )  # fmt: skip


def _chart(history: _History) -> FleetChart:
    return FleetChart(
        interval_s=history.interval_s, t=history.timestamps, usd_per_hr=history.usd_per_hour,
        ondemand_usd_per_hr=history.ondemand_usd_per_hour,
        usd_per_stream_hr=history.usd_per_stream_hour,
    )  # fmt: skip


class FleetFeed(OrchestratorFeed):
    """The orchestrator's view of the fleet, refreshed at most every ``every_s`` while read,
    shared by every console (see the module)."""

    panel_name = "fleet panel"

    def __init__(
        self,
        client: OrchestratorClient,
        *,
        every_s: float = REFRESH_S,
        history_every_s: float = HISTORY_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(client, every_s=every_s, clock=clock)
        self.history_every_s = history_every_s
        self._history_at: float | None = None
        self._fleet: _Fleet | None = None
        self._chart: FleetChart | None = None
        self._events: collections.deque[_Event] = collections.deque(maxlen=EVENTS)

    async def panel(self) -> FleetPanel:
        await self.refresh_if_due()
        return self._view()

    def _requests(self, history: bool) -> list[Request]:
        newest = self._events[-1].t if self._events else None
        since = {"since": repr(max(0.0, newest - EVENT_OVERLAP_S))} if newest is not None else {}
        wanted: list[Request] = [("/v1/fleet", {}), ("/v1/events", since)]
        return [*wanted, ("/v1/history", {})] if history else wanted

    async def _fetch(self, now: float) -> None:
        history = self._history_at is None or now - self._history_at >= self.history_every_s
        answers = await self.client.get_all(self._requests(history))
        fleet, events = _Fleet.model_validate(answers[0]), _Events.model_validate(answers[1])
        chart = _chart(_History.model_validate(answers[2])) if history else self._chart
        if history:
            self._history_at = now
        self._fleet, self._chart = fleet, chart
        self._merge(events.events)

    def _merge(self, events: list[_Event]) -> None:
        """Add the events not held yet (``since`` overlaps), keeping the newest."""
        held = {(e.seq, e.t, e.kind, e.pod) for e in self._events}
        self._events.extend(e for e in events if (e.seq, e.t, e.kind, e.pod) not in held)

    def _view(self) -> FleetPanel:
        fleet = self._fleet
        provider = _text(fleet.provider) if fleet is not None else None
        return FleetPanel(
            **self._age(), provider=provider,
            pods=[_pod(p, provider or "") for p in fleet.pods] if fleet is not None else [],
            cost=_cost(fleet) if fleet is not None else None,
            events=[_event(e) for e in self._events], history=self._chart,
        )  # fmt: skip


def _event(event: _Event) -> FleetEvent:
    return FleetEvent(t=event.t, kind=_text(event.kind), pod=_text(event.pod),
                      stream=_text(event.stream) if event.stream is not None else None,
                      reason=_text(event.reason))  # fmt: skip


def fleet_router(
    settings: IngestSettings, api: ApiAuth, *, feed: FleetFeed | None = None
) -> APIRouter:
    """``GET /v1/console/fleet``; ConfigError when an orchestrator is configured but the
    ingest has no way to authenticate to it or cannot load its CA file."""
    if feed is None:
        client = OrchestratorClient.from_settings(settings)
        feed = FleetFeed(client) if client is not None else None
    router = APIRouter(route_class=AuthFirstRoute, tags=["console"])

    @router.get("/v1/console/fleet", dependencies=[api.requires("streams:read")],
                summary="The console's fleet panel", response_model=FleetPanel)  # fmt: skip
    async def fleet_panel() -> Response:
        """The orchestrator's GPU fleet for the console: pods (provider, tier, GPU, state,
        canary latency, uptime, $/h), cost now and so far (per stream-hour, saving against
        all on-demand), the last 50 fleet events, the last hour of $/h. Refreshed from the
        orchestrator at most every 2 s for all consoles together; when it cannot be reached
        the last data stays, with its age, `stale: true` and the reason in `error`. Without
        an orchestrator (`FRAMERELAY_INGEST_ORCHESTRATOR_URL`): `{"configured": false}`."""
        return await panel_response(feed)

    return router


__all__ = ["REFRESH_S", "FleetFeed", "FleetPanel", "fleet_router"]
