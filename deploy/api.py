"""The orchestrator's HTTP API (FastAPI) and Prometheus ``/metrics``.

* ``GET /healthz``; ``GET /metrics``
* ``GET /v1/pods``; ``POST /v1/pods`` ``{"tier": ..}`` (one more warm pod in a
  tier: raises the tier's floor); ``DELETE /v1/pods/{name}`` (terminate now;
  the fleet replaces it if its tier still needs it)
* ``GET /v1/streams``; ``POST /v1/streams`` (a StreamSpec);
  ``DELETE /v1/streams/{id}``; ``POST /v1/streams/{id}/move`` ``{"worker": ..}``
* ``GET /v1/fleet``: tiers, pods, streams, cost, recent events
* ``GET /v1/history``: the last hour of cost and fleet size; ``GET /v1/events``
  ``?since=<unix time>``: the fleet's event log (:mod:`deploy.history_api`)
* ``POST /v1/jobs``, ``GET /v1/jobs``, ``GET|DELETE /v1/jobs/{id}``: batch jobs
  (:mod:`deploy.jobs_api`; scopes ``jobs:read``, ``jobs:write``)
* ``GET /openapi.json``, ``/docs`` (Swagger UI), ``/redoc``: open, served
  offline (:mod:`framerelay.openapi_docs`)

Every route but ``/healthz`` and the API's description needs a bearer token for audience
``framerelay-orchestrator``: scope ``fleet:read`` to read, ``fleet:write`` to
change anything; ``/metrics`` is open unless ``metrics_auth`` (then
``metrics:read``). Refusals (401/403/429) happen before the route runs, are
counted in ``framerelay_orch_auth_refused_total{reason}``, and failed
authentications are throttled per peer address. A 422 says where and why,
never the submitted values; stream URLs are shown without their passwords.
Request bodies are capped at ``max_body_bytes`` (default 1 MiB; 413, see
:mod:`framerelay.web_limits`): a larger ``Content-Length`` is refused before
the token is checked, a larger chunked body once the route reads it (after
its token passed). Every number in a body is finite and bounded (422).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Mapping
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from pydantic import BaseModel, ConfigDict, Field

from deploy.cost import CostTotals
from deploy.history_api import history_router
from deploy.jobs_api import jobs_router
from deploy.latency import region_of
from deploy.models import PodRecord, StreamSpec
from deploy.service import Orchestrator
from deploy.workers import by_name
from framerelay.auth import AUD_ORCHESTRATOR, AuthGuard, FailureLimiter, TokenVerifier
from framerelay.auth.revocation import RevocationList
from framerelay.auth.web import ApiAuth, AuthFirstRoute, install_validation_handler
from framerelay.openapi_docs import errors, install_docs
from framerelay.redact import redact_text, redact_url
from framerelay.web_limits import BodyLimit

READ, WRITE, METRICS = "fleet:read", "fleet:write", "metrics:read"
SECURITY = (
    "A JWT for audience `framerelay-orchestrator` (`framerelay token mint --aud orchestrator`). "
    "Scopes: `fleet:read` (read the fleet, pods, streams), `fleet:write` (change them), "
    "`metrics:read` (`/metrics`, only with `FRAMERELAY_ORCH_METRICS_AUTH=true`), "
    "`jobs:read` (batch jobs and their progress), `jobs:write` (submit and cancel jobs)."
)


class NewPod(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tier: str


class Move(BaseModel):
    model_config = ConfigDict(extra="forbid")
    worker: str = Field(min_length=1, max_length=200)


def _pod_view(rec: PodRecord, assigned: dict[str, str], now: float) -> dict[str, Any]:
    """A pod as the API shows it: its record, the streams it serves, its uptime (since the
    orchestrator created it; None for a record without a creation time)."""
    view = rec.model_dump(exclude={"fails", "last_canary"})
    mine = {w.name for w in rec.workers()}  # one per GPU
    view["streams"] = sorted(s for s, w in assigned.items() if w in mine)
    view["uptime_s"] = round(max(0.0, now - rec.created_at), 1) if rec.created_at else None
    return view


async def fleet_status(orch: Orchestrator) -> dict[str, Any]:
    store, fleet = orch.store, orch.fleet
    pods, streams, assigned = await store.pods(), await store.streams(), await store.assignments()
    cost = CostTotals.from_flat(await store.cost())
    now = fleet.clock.now()
    tiers = []
    for t in orch.settings.tiers:
        mine = [p for p in pods.values() if p.tier == t.name]
        held = fleet.held_until(t.name) - now
        tiers.append({
            "name": t.name, "spot": t.interruptible, "target": fleet.targets.get(t.name, 0),
            "pods": len(mine), "ready": sum(p.ready for p in mine),
            "draining": sum(p.state == "draining" for p in mine),
            "no_capacity_retry_in_s": round(held, 1) if held > 0 else None,
        })  # fmt: skip
    return {
        "leader": orch.leader,
        "provider": orch.provider.name,
        "tiers": tiers,
        "pods": [
            {**_pod_view(p, assigned, now), "region": region_of(orch.settings, p.tier)}
            for p in sorted(pods.values(), key=lambda p: p.name)
        ],
        "streams": [
            {
                **_stream_view(s),
                "worker": assigned.get(s.id),
                "slo_breach": fleet.latency.view(s.id),
            }
            for s in sorted(streams.values(), key=lambda s: s.id)
        ],
        "unplaced": fleet.unplaced,
        "cost": {**cost.as_dict(), "burn_usd_per_hr": round(fleet.burn_rate(pods), 4)},
        "counters": dict(fleet.counters),
        "events": list(fleet.events)[-50:],
        "last_error": redact_text(orch.last_error) if orch.last_error else None,
    }


def _stream_view(spec: StreamSpec) -> dict[str, Any]:
    return {**spec.model_dump(), "url": redact_url(spec.url)}


COST_COUNTERS = (
    ("fleet_cost_usd", "fleet_usd", 1.0, "Fleet cost so far ($)"),
    ("ondemand_equivalent_cost_usd", "ondemand_equiv_usd", 1.0,
     "What the same capacity would have cost on on-demand ($)"),
    ("stream_seconds", "stream_hours", 3600.0, "Stream-seconds served"),
    ("serverless_cost_usd", "serverless_usd", 1.0,
     "Of the fleet cost: execution time charged to jobs on serverless endpoints ($)"),
)  # fmt: skip
"""``(metric, cost key, factor, help)``: cumulative costs, as counters."""
COST_GAUGES = (
    ("saving_vs_ondemand_ratio", "saving_vs_ondemand", "Share saved vs all on-demand (0..1)"),
    ("cost_per_stream_hour_usd", "cost_per_stream_hour_usd", "Fleet cost per stream-hour ($)"),
    ("burn_rate_usd_per_hour", "burn_usd_per_hr", "Current fleet cost per hour ($/h)"),
)
"""``(metric, cost key, help)``: ratios and rates, as gauges."""
ORCH = "framerelay_orch_"


class _Families:
    """A registry of metric families built for one scrape (no ``_created`` series: the
    values are totals kept elsewhere, not counters of this registry)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def render_metrics(status: dict[str, Any], refused: Mapping[str, int] | None = None) -> bytes:
    auth = CounterMetricFamily(ORCH + "auth_refused", "Refused API requests by reason",
                               labels=["reason"])  # fmt: skip
    for reason, n in (refused or {}).items():
        auth.add_metric([reason], n)
    events = CounterMetricFamily(ORCH + "events", "Fleet events by kind", labels=["kind"])
    for kind, n in status["counters"].items():
        events.add_metric([kind], n)
    cost = status["cost"]
    families: list[Metric] = [auth, events, *_fleet_gauges(status)]
    for name, key, factor, help_ in COST_COUNTERS:
        families.append(CounterMetricFamily(ORCH + name, help_, value=float(cost[key]) * factor))
    for name, key, help_ in COST_GAUGES:
        families.append(GaugeMetricFamily(ORCH + name, help_, value=float(cost[key])))
    reg = CollectorRegistry()
    reg.register(_Families(families))
    return bytes(generate_latest(reg))


def _fleet_gauges(status: dict[str, Any]) -> list[Metric]:
    pods = GaugeMetricFamily(ORCH + "pods", "Pods by tier and state", labels=["tier", "state"])
    ready = GaugeMetricFamily(ORCH + "ready_workers", "Ready workers by tier", labels=["tier"])
    target = GaugeMetricFamily(ORCH + "target_workers", "Target by tier", labels=["tier"])
    for t in status["tiers"]:
        ready.add_metric([t["name"]], t["ready"])
        target.add_metric([t["name"]], t["target"])
    by_state = collections.Counter((p["tier"], p["state"]) for p in status["pods"])
    for (tier, state), n in sorted(by_state.items()):
        pods.add_metric([tier, state], n)
    streams = GaugeMetricFamily(ORCH + "streams", "Streams by placement", labels=["placed"])
    streams.add_metric(["yes"], sum(1 for s in status["streams"] if s["worker"]))
    streams.add_metric(["no"], len(status["unplaced"]))
    return [pods, ready, target, streams, *_latency_gauges(status)]


def _latency_gauges(status: dict[str, Any]) -> list[Metric]:
    """Round trips from the ingest per worker, and streams over their latency budget."""
    rtt = GaugeMetricFamily(ORCH + "worker_rtt_seconds", "Round trip from the ingest (s)",
                            labels=["worker", "tier", "region"])  # fmt: skip
    for pod in status["pods"]:
        for w in pod.get("gpus") or [pod]:
            if w.get("rtt_ms") is not None:
                where = [w["name"], pod["tier"], pod.get("region") or ""]
                rtt.add_metric(where, w["rtt_ms"] / 1000)
    late = sum(1 for s in status["streams"] if s.get("slo_breach"))
    breach = GaugeMetricFamily(ORCH + "slo_breach_streams",
                               "Streams placed over their latency budget", value=late)  # fmt: skip
    return [rtt, breach]


def api_auth(orch: Orchestrator) -> ApiAuth:
    """The API's gate: the orchestrator's keys, its audience, its refusal counter."""
    s = orch.settings
    revoked = RevocationList(s.revoked_tokens_file) if s.revoked_tokens_file else None
    verifier = TokenVerifier(
        orch.keys, AUD_ORCHESTRATOR, leeway_s=s.token_leeway_s, revoked=revoked
    )
    limiter = FailureLimiter(s.auth_max_failures, s.auth_window_s)

    def refused(reason: str) -> None:
        orch.auth_refused[reason] += 1

    return ApiAuth(AuthGuard(verifier, limiter=limiter, on_refusal=refused))


def create_app(orch: Orchestrator) -> FastAPI:
    app = FastAPI(
        title="framerelay orchestrator", version="1", docs_url=None, redoc_url=None,
        openapi_url=None,
    )  # fmt: skip
    install_validation_handler(app)
    install_docs(app, SECURITY)
    app.add_middleware(BodyLimit, max_bytes=orch.settings.max_body_bytes,
                       setting="FRAMERELAY_ORCH_MAX_BODY_BYTES")  # fmt: skip
    auth = api_auth(orch)
    app.include_router(_fleet_router(orch, auth))
    app.include_router(_pods_router(orch, auth))
    app.include_router(_streams_router(orch, auth))
    app.include_router(history_router(orch, auth.requires(READ)))
    app.include_router(jobs_router(orch, auth))
    return app


def _fleet_router(orch: Orchestrator, auth: ApiAuth) -> APIRouter:
    router = APIRouter(route_class=AuthFirstRoute)

    @router.get("/healthz", summary="Liveness", tags=["health"])
    async def healthz() -> dict[str, Any]:
        """Answers while the process runs: whether it leads, and its reconcile passes."""
        return {"status": "ok", "leader": orch.leader, "ticks": orch.ticks}

    metrics_deps = [auth.requires(METRICS)] if orch.settings.metrics_auth else []

    @router.get("/metrics", dependencies=metrics_deps, summary="Prometheus metrics",
                tags=["health"], response_class=PlainTextResponse)  # fmt: skip
    async def metrics() -> Response:
        """Prometheus text: pods, workers, streams, cost, fleet events, refusals. Open unless
        ``FRAMERELAY_ORCH_METRICS_AUTH`` (then ``metrics:read``)."""
        body = render_metrics(await fleet_status(orch), orch.auth_refused)
        return Response(body, media_type="text/plain; version=0.0.4")

    @router.get("/v1/fleet", dependencies=[auth.requires(READ)], summary="Fleet status",
                tags=["fleet"])  # fmt: skip
    async def fleet() -> dict[str, Any]:
        """Tiers, pods, streams and their workers, cost so far, counters, recent events."""
        return await fleet_status(orch)

    return router


def _pods_router(orch: Orchestrator, auth: ApiAuth) -> APIRouter:
    router = APIRouter(route_class=AuthFirstRoute)
    store = orch.store

    @router.get("/v1/pods", dependencies=[auth.requires(READ)], summary="List pods",
                tags=["pods"])  # fmt: skip
    async def pods() -> list[dict[str, Any]]:
        """Every pod: tier, state, readiness, cost per hour and the streams it serves."""
        return list((await fleet_status(orch))["pods"])

    @router.post("/v1/pods", status_code=202, dependencies=[auth.requires(WRITE)],
                 summary="Add a warm pod", tags=["pods"],
                 responses=errors(404, e404="No such tier"))  # fmt: skip
    async def create_pod(body: NewPod) -> dict[str, Any]:
        """One more warm pod in a tier (raises the tier's floor); created on the next pass."""
        if orch.settings.tier(body.tier) is None:
            names = [t.name for t in orch.settings.tiers]
            raise HTTPException(404, f"no tier {body.tier!r}; tiers are {names}")
        floor = await store.raise_floor(body.tier, 1)
        return {"tier": body.tier, "floor": floor, "note": "created on the next reconcile pass"}

    @router.delete("/v1/pods/{name}", dependencies=[auth.requires(WRITE)],
                   summary="Terminate a pod", tags=["pods"],
                   responses=errors(404, e404="No such pod"))  # fmt: skip
    async def terminate_pod(name: str) -> dict[str, Any]:
        """Terminate now and lower the tier's floor; the fleet replaces it if still needed."""
        rec = (await store.pods()).get(name)
        if rec is None:
            raise HTTPException(404, f"no pod {name!r}")
        await store.raise_floor(rec.tier, -1)
        if rec.provider_id is not None:
            await orch.provider.terminate(rec.provider_id)
        await store.del_pod(name)
        orch.fleet.event("terminated_by_operator", name, "DELETE /v1/pods by an operator")
        return {"terminated": name}

    return router


MOVE_ERRORS = errors(
    404, 409, e404="No such stream or worker", e409="A critical stream cannot run on a spot worker"
)


def _streams_router(orch: Orchestrator, auth: ApiAuth) -> APIRouter:
    router = APIRouter(route_class=AuthFirstRoute)
    store = orch.store

    @router.get("/v1/streams", dependencies=[auth.requires(READ)], summary="List streams",
                tags=["streams"])  # fmt: skip
    async def streams() -> list[dict[str, Any]]:
        """Every stream (URL without its password) and the worker it is placed on."""
        return list((await fleet_status(orch))["streams"])

    @router.post("/v1/streams", status_code=201, dependencies=[auth.requires(WRITE)],
                 summary="Add a stream", tags=["streams"],
                 responses=errors(409, e409="A stream with this id exists"))  # fmt: skip
    async def add_stream(spec: StreamSpec) -> dict[str, Any]:
        """Add a stream; the next reconcile pass places it on a worker. With a model
        registry, a model it lacks is a 422 naming the models it has."""
        problem = orch.model_problem(spec.model)
        if problem is not None:
            raise RequestValidationError([{"type": "unknown_model", "loc": ("body", "model"),
                                           "msg": problem}])  # fmt: skip
        if spec.id in await store.streams():
            raise HTTPException(409, f"stream {spec.id!r} exists; remove it first")
        await store.put_stream(spec)
        return _stream_view(spec)

    @router.delete("/v1/streams/{stream_id}", dependencies=[auth.requires(WRITE)],
                   summary="Remove a stream", tags=["streams"],
                   responses=errors(404, e404="No such stream"))  # fmt: skip
    async def rm_stream(stream_id: str) -> dict[str, str]:
        """Remove a stream; the ingest stops it on the next pass."""
        if not await store.del_stream(stream_id):
            raise HTTPException(404, f"no stream {stream_id!r}")
        return {"removed": stream_id}

    @router.post("/v1/streams/{stream_id}/move", dependencies=[auth.requires(WRITE)],
                 summary="Move a stream to a worker", tags=["streams"],
                 responses=MOVE_ERRORS)  # fmt: skip
    async def move_stream(stream_id: str, body: Move) -> dict[str, str]:
        """Pin a stream to a worker; it moves, with its tracker state, on the next pass."""
        spec = (await store.streams()).get(stream_id)
        found = by_name((await store.pods()).values()).get(body.worker)
        rec = found[0] if found is not None else None
        if spec is None or rec is None:
            raise HTTPException(404, f"no stream {stream_id!r} or no worker {body.worker!r}")
        tier = orch.settings.tier(rec.tier)
        if spec.priority == "critical" and (tier is None or not tier.takes_critical):
            raise HTTPException(
                409,
                f"critical streams run only on tiers of the secure cloud that are not "
                f"interruptible; {body.worker!r} is of tier {rec.tier!r}",
            )
        await store.set_pin(stream_id, body.worker)
        return {"stream": stream_id, "worker": body.worker, "note": "moves on the next pass"}

    return router
