"""The orchestrator's job routes (issue 18; scopes ``jobs:read``, ``jobs:write``).

* ``POST /v1/jobs`` (a :class:`framerelay.jobs.JobSpec`): 201 with the job's status; its
  tasks start on the next reconcile pass. 422 for a bad spec (NaN or out-of-range numbers,
  more than 1000 inputs, a model the registry lacks) or an input that cannot be a task
  (:mod:`deploy.job_inputs`: where and why, never the input), or ``serverless`` true with no
  serverless tier for its priority; 409 for a job id in use. The job's serverless tier, if
  any, is chosen here (:func:`deploy.serverless_jobs.choose`).
* ``GET /v1/jobs?limit=100``: the newest jobs kept, newest first; ``GET /v1/jobs/{id}``:
  one, with each task's progress, frames done/total, ETA, cost so far, start and end.
* ``DELETE /v1/jobs/{id}``: cancel (its task streams are removed; the sidecars keep what
  was written); 409 once it has ended.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError

from deploy.job_inputs import InputError, expand_inputs
from deploy.jobs import JobRecord, JobView, TaskRecord, cancel, job_view
from deploy.serverless_jobs import NoServerlessTier, choose
from deploy.service import Orchestrator
from framerelay.auth.web import ApiAuth, AuthFirstRoute
from framerelay.jobs import JOB_ID, JobSpec
from framerelay.openapi_docs import errors

JOBS_READ, JOBS_WRITE = "jobs:read", "jobs:write"
JobId = Annotated[str, PathParam(pattern=JOB_ID, description="The job's id.")]
Limit = Annotated[int, Query(ge=1, le=1000, description="The newest this many jobs.")]


def _input_error(exc: InputError) -> RequestValidationError:
    loc: tuple[Any, ...] = (
        ("body", "inputs") if exc.index is None else ("body", "inputs", exc.index)
    )
    return RequestValidationError([{"type": "bad_input", "loc": loc, "msg": exc.message}])


async def new_job(orch: Orchestrator, spec: JobSpec) -> JobRecord:
    """A job record for ``spec`` (its inputs expanded into tasks), or the 422 to answer."""
    problem = orch.model_problem(spec.model)
    if problem is not None:
        raise RequestValidationError([{"type": "unknown_model", "loc": ("body", "model"),
                                       "msg": problem}])  # fmt: skip
    try:
        endpoints = orch.serverless.ready if orch.serverless is not None else {}
        serverless = choose(orch.settings, spec, endpoints)
    except NoServerlessTier as exc:
        raise RequestValidationError(
            [{"type": "no_serverless_tier", "loc": ("body", "serverless"), "msg": str(exc)}]
        ) from None
    job_id = spec.id or secrets.token_hex(4)
    try:
        jobs = orch.settings.jobs
        tasks = await asyncio.to_thread(
            expand_inputs, spec.inputs, job_id, jobs.output_dir, jobs.input_dirs
        )
    except InputError as exc:
        raise _input_error(exc) from None
    return JobRecord(
        id=job_id, spec=spec.model_copy(update={"id": job_id}), submitted_at=orch.fleet.clock.now(),
        tasks=[TaskRecord(input=t.url, sidecar=t.sidecar) for t in tasks], serverless=serverless,
    )  # fmt: skip


CANCEL_ERRORS = errors(404, 409, e404="No such job", e409="The job has ended")


async def cancelled(orch: Orchestrator, job_id: str) -> JobRecord:
    """Cancel the job (404: none; 409: it has ended), tried again while a driver pass
    changes it at the same moment."""
    now = orch.fleet.clock.now()
    for _ in range(20):
        rec = await orch.jobs.get(job_id)
        if rec is None:
            raise HTTPException(404, f"no job {job_id!r}")
        if not rec.active:
            raise HTTPException(409, f"job {job_id!r} is {rec.state} already")
        after = await orch.jobs.change(job_id, lambda r: cancel(r, now))
        if after is not None:
            return after
        await asyncio.sleep(0.05)
    raise HTTPException(503, "the job kept changing; try again")


def jobs_router(orch: Orchestrator, auth: ApiAuth) -> APIRouter:
    """The job routes, behind ``auth``."""
    router = APIRouter(route_class=AuthFirstRoute, tags=["jobs"])
    jobs = orch.jobs

    async def view(rec: JobRecord) -> JobView:
        return job_view(rec, await jobs.progress(rec), orch.fleet.clock.now())

    @router.post("/v1/jobs", status_code=201, dependencies=[auth.requires(JOBS_WRITE)],
                 summary="Submit a batch job",
                 responses=errors(409, e409="A job with this id exists"))  # fmt: skip
    async def submit(spec: JobSpec) -> JobView:
        """Re-process recordings, files or URLs with a model at full speed on the cheapest
        capacity its priority allows (batch: batch-only tiers, scaled from zero). Results
        go to sidecars beside local inputs."""
        rec = await new_job(orch, spec)
        if not await jobs.submit(rec):
            raise HTTPException(409, f"job {rec.id!r} exists; pick another id")
        return await view(rec)

    @router.get("/v1/jobs", dependencies=[auth.requires(JOBS_READ)], summary="List jobs")
    async def list_jobs(limit: Limit = 100) -> list[JobView]:
        """The newest jobs kept (``limit``, 100 by default), newest first."""
        return [await view(rec) for rec in reversed(await jobs.many(await jobs.ids(limit)))]

    @router.get("/v1/jobs/{job_id}", dependencies=[auth.requires(JOBS_READ)],
                summary="A job's progress", responses=errors(404, e404="No such job"))  # fmt: skip
    async def get_job(job_id: JobId) -> JobView:
        """Per-task progress, frames done/total, ETA (from the recent rate), cost so far,
        start and end."""
        rec = await jobs.get(job_id)
        if rec is None:
            raise HTTPException(404, f"no job {job_id!r}")
        return await view(rec)

    @router.delete("/v1/jobs/{job_id}", dependencies=[auth.requires(JOBS_WRITE)],
                   summary="Cancel a job", responses=CANCEL_ERRORS)  # fmt: skip
    async def cancel_job(job_id: JobId) -> JobView:
        """Stop the job: its task streams are removed (the ingest stops them on the next
        pass); its sidecars keep the results written so far."""
        return await view(await cancelled(orch, job_id))

    return router
