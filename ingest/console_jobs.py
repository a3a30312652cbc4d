"""The console's jobs panel: ``GET /v1/console/jobs`` (``streams:read``).

What the orchestrator (``FRAMERELAY_INGEST_ORCHESTRATOR_URL``, read over HTTP by
:mod:`ingest.orchestrator_client`, scope ``jobs:read``) says about its batch jobs
(issue 18), one row a job for the page: id, state, model, frames done and total
with the percentage, ETA, cost so far (final once the job has ended), duration,
tasks done and total, and the job's error. Without an orchestrator the answer is
``{"configured": false}``.

As :mod:`ingest.console_fleet` does for the fleet, one :class:`JobsFeed` serves
every console: it asks the orchestrator's ``GET /v1/jobs?limit=`` (the newest
:data:`LIMIT`) at most once per :data:`REFRESH_S`, only while someone reads the
panel, and answers everyone else from the last answer. When the orchestrator
fails (unreachable, timed out, refused the token, sent something unreadable)
the panel keeps the last good rows, says how old they are (``age_s``,
``stale: true``) and why (``error``: one line, never a secret).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from framerelay.auth.web import ApiAuth, AuthFirstRoute
from ingest.console_feed import REFRESH_S, OrchestratorFeed, panel_response
from ingest.orchestrator_client import OrchestratorClient
from ingest.settings import IngestSettings

log = logging.getLogger(__name__)
LIMIT = 50
"""The newest jobs shown."""
MAX_TASKS = 1000
"""A job's inputs, at most (:data:`framerelay.jobs.MAX_INPUTS`)."""
MAX_FRAMES = 10**15
TEXT_CHARS = 300
ENDED = frozenset({"done", "failed", "cancelled"})


# -- what the ingest reads of the orchestrator's answer (other fields are ignored) ---------


class _Upstream(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class _Spec(_Upstream):
    model: str = ""


class _Task(_Upstream):
    state: str = ""


class _Job(_Upstream):
    id: str
    state: str
    spec: _Spec = Field(default_factory=_Spec)
    tasks: list[_Task] = Field(default_factory=list, max_length=MAX_TASKS)
    frames_done: int = Field(0, ge=0, le=MAX_FRAMES)
    frames_total: int | None = Field(None, ge=0, le=MAX_FRAMES)
    submitted_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    eta_s: float | None = Field(None, ge=0)
    cost_usd: float = Field(0.0, ge=0)
    error: str | None = None
    duration_s: float | None = Field(None, ge=0)


_JOBS = TypeAdapter(list[_Job])


# -- what the page gets ----------------------------------------------------------------------


class JobRow(BaseModel):
    """One batch job."""

    id: str
    state: str = Field(description="queued, running, done, failed or cancelled.")
    ended: bool = Field(description="done, failed or cancelled: its cost is final.")
    model: str
    frames_done: int
    frames_total: int | None = Field(description="null until every input is open.")
    percent: float | None = Field(description="frames_done / frames_total in % (0-100).")
    eta_s: float | None = Field(description="Seconds left at the recent rate (running only).")
    cost_usd: float = Field(description="Cost so far; the final cost once it has ended.")
    duration_s: float | None = Field(description="Since its first task started (null: not yet).")
    tasks_done: int
    tasks_total: int
    submitted_at: float = Field(description="Unix time (the orchestrator's clock).")
    finished_at: float | None
    error: str | None = Field(description="Why it failed, in one line.")


class JobsPanel(BaseModel):
    """The jobs panel; without an orchestrator only ``{"configured": false}``."""

    configured: bool = Field(description="An orchestrator is configured.")
    orchestrator: str | None = Field(None, description="Its URL.")
    fetched_at: float | None = Field(None, description="Unix time of the rows shown.")
    age_s: float | None = Field(None, description="How old the rows shown are.")
    stale: bool = Field(False, description="The last refresh failed: older rows shown.")
    error: str | None = Field(None, description="Why the last refresh failed, in one line.")
    jobs: list[JobRow] = Field(default_factory=list, description=f"The newest {LIMIT}.")


def _text(value: str | None) -> str:
    """One printable line of at most :data:`TEXT_CHARS` (upstream text is not trusted)."""
    line = " ".join((value or "").split())
    return "".join(c for c in line if c.isprintable())[:TEXT_CHARS]


def _percent(job: _Job) -> float | None:
    total = job.frames_total
    if total is None:
        return None
    if total == 0:
        return 100.0 if job.state == "done" else 0.0
    return round(min(100.0, 100 * job.frames_done / total), 1)


def _duration(job: _Job, fetched_at: float) -> float | None:
    """The orchestrator's ``duration_s``; else from its start to its end (or to now)."""
    if job.duration_s is not None or job.started_at is None:
        return job.duration_s
    end = job.finished_at if job.finished_at is not None else fetched_at
    return round(max(0.0, end - job.started_at), 1)


def _row(job: _Job, fetched_at: float) -> JobRow:
    ended = job.state in ENDED
    return JobRow(
        id=_text(job.id), state=_text(job.state), ended=ended, model=_text(job.spec.model),
        frames_done=job.frames_done, frames_total=job.frames_total, percent=_percent(job),
        eta_s=None if ended else job.eta_s, cost_usd=round(job.cost_usd, 6),
        duration_s=_duration(job, fetched_at),
        tasks_done=sum(t.state == "done" for t in job.tasks), tasks_total=len(job.tasks),
        submitted_at=job.submitted_at, finished_at=job.finished_at,
        error=_text(job.error) if job.error else None,
    )  # fmt: skip


class JobsFeed(OrchestratorFeed):
    """The orchestrator's newest jobs, refreshed at most every ``every_s`` while read, shared
    by every console (see the module)."""

    panel_name = "jobs panel"

    def __init__(
        self,
        client: OrchestratorClient,
        *,
        every_s: float = REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(client, every_s=every_s, clock=clock)
        self._rows: list[JobRow] = []

    async def panel(self) -> JobsPanel:
        await self.refresh_if_due()
        return self._view()

    def _problem(self, exc: ValidationError) -> str:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the answer"
        return f"the orchestrator's jobs are not what this ingest reads ({where}: {first['msg']})"

    async def _fetch(self, now: float) -> None:
        answers = await self.client.get_all([("/v1/jobs", {"limit": str(LIMIT)})])
        jobs = _JOBS.validate_python(answers[0])
        fetched_at = time.time()
        self._rows = [_row(job, fetched_at) for job in jobs[:LIMIT]]

    def _view(self) -> JobsPanel:
        return JobsPanel(**self._age(), jobs=self._rows)


def jobs_router(
    settings: IngestSettings, api: ApiAuth, *, feed: JobsFeed | None = None
) -> APIRouter:
    """``GET /v1/console/jobs``; ConfigError when an orchestrator is configured but the
    ingest has no way to authenticate to it or cannot load its CA file."""
    if feed is None:
        client = OrchestratorClient.from_settings(settings)
        feed = JobsFeed(client) if client is not None else None
    router = APIRouter(route_class=AuthFirstRoute, tags=["console"])

    @router.get("/v1/console/jobs", dependencies=[api.requires("streams:read")],
                summary="The console's jobs panel", response_model=JobsPanel)  # fmt: skip
    async def jobs_panel() -> Response:
        """The orchestrator's newest 50 batch jobs for the console: state, model, frames
        done/total and %, ETA, cost so far (final once ended), duration, tasks done/total,
        error. Refreshed from the orchestrator (`GET /v1/jobs`, scope `jobs:read`) at most
        every 2 s for all consoles together; when it cannot be reached the last rows stay,
        with their age, `stale: true` and the reason in `error`. Without an orchestrator
        (`FRAMERELAY_INGEST_ORCHESTRATOR_URL`): `{"configured": false}`."""
        return await panel_response(feed)

    return router


__all__ = ["REFRESH_S", "JobsFeed", "JobsPanel", "jobs_router"]
