"""Batch jobs in the orchestrator (issue 18): kept in Redis, run as task streams.

A job (:class:`framerelay.jobs.JobSpec`) is stored as a :class:`JobRecord` with one
:class:`TaskRecord` per input (a recording directory: one per segment,
:mod:`deploy.job_inputs`). The driver (:meth:`JobDriver.tick`, once per reconcile pass of
the leading orchestrator, after the fleet's) turns queued tasks into *task streams*
(``job-<job>-<k>``: batch or standard priority, lossless, not looped, carrying a
:class:`framerelay.jobs.JobTask`), at most ``max_parallel`` of a job at a time, in input
order. The ingest that runs a task keeps its :class:`framerelay.jobs.TaskProgress` in Redis;
once it says ``done`` (or ``failed``) the driver removes the task's stream and starts the
next. A job is ``done`` when every task is (``failed`` when one failed), ``cancelled`` by
``DELETE /v1/jobs/{id}`` (its task streams are removed).

A task stream claims one whole worker when it is planned and placed
(:func:`placement_view`): it reads its input as fast as the worker answers, so its frame
rate (the sampling rate; all frames: :data:`ALL_FRAMES_FPS`) says nothing of its load. The
scaler thus opens a pod for each task up to ``max_parallel`` on the cheapest allowed tier
(a batch job: batch-only tiers only), from zero, and drains them when the tasks end.

**Cost.** Every pass the job is charged its share of the pods its tasks ran on since the
last pass: for each worker serving one of its tasks, the worker's $/h (its pod's over the
pod's GPUs) over the streams on that worker; a batch job also shares the idle pods of
batch-only tiers (starting up for it, or between two tasks) with the other batch jobs
running. ``pod_seconds`` is the same share in pod-seconds.

**Serverless tiers** (:mod:`deploy.serverless_jobs`): a job may run on a tier with a
RunPod serverless endpoint instead (chosen at submission, kept in
:attr:`JobRecord.serverless`): its tasks name the endpoint, are left out of
:func:`placement_view` (no pod), and the job is charged the execution seconds its ingest
reports at the tier's price a second, not a share of pods.

Redis (orchestrator prefix ``<p>``): ``<p>job:<id>`` (string, JobRecord JSON),
``<p>jobs`` (zset, id by submission time) and ``<p>jobs:active`` (set: the queued and
running ones, all a pass reads). Every change of a job and of its task streams
is one transaction watched on the job's key, so a cancel racing a driver pass never
leaves a stream behind. Jobs survive an orchestrator restart.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis
from redis.exceptions import WatchError

from deploy.clock import Clock
from deploy.cost import serverless_spend
from deploy.models import PodRecord, StreamSpec
from deploy.placement import allowed
from deploy.providers.base import GpuPrice
from deploy.scaling import per_worker
from deploy.serverless_jobs import ServerlessChoice, batch_pinned, endpoint_of, execution_s
from deploy.settings import OrchestratorSettings
from deploy.sizing import expected_fps
from deploy.store import Store
from framerelay.jobs import (
    JobSpec,
    JobState,
    JobStatus,
    JobTask,
    TaskProgress,
    checkpoint_key,
    progress_key,
    task_stream_id,
)
from framerelay.redact import redact_text, redact_url

log = logging.getLogger(__name__)
ALL_FRAMES_FPS = 240.0
"""A task stream's sampling rate when the job keeps every frame (``fps`` 0): the most a
stream spec takes; the sampler keeps frames at least 1/fps apart, so every frame of any
video up to 240 fps."""
MAX_RATE_SAMPLES = 64
ACTIVE: tuple[JobState, ...] = ("queued", "running")
TaskRun = Literal["pending", "running", "done", "failed"]


class TaskRecord(BaseModel):
    """One input of a job as the orchestrator keeps it."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    input: str
    sidecar: str
    state: TaskRun = "pending"
    started_at: float | None = None
    finished_at: float | None = None
    execution_s: float = Field(0.0, ge=0, description="Billed on a serverless endpoint.")


class JobRecord(BaseModel):
    """A job as stored (``<p>job:<id>``); readers ignore fields they do not know."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    id: str
    spec: JobSpec
    state: JobState = "queued"
    tasks: list[TaskRecord]
    submitted_at: float
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = Field(None, max_length=1000)
    cost_usd: float = 0.0
    pod_seconds: float = 0.0
    accrued_at: float | None = None
    rate: list[tuple[float, int]] = Field(
        default_factory=list, description="Recent (time, frames done), for the ETA."
    )
    serverless: ServerlessChoice | None = Field(
        None, description="The serverless tier its tasks run on (deploy.serverless_jobs)."
    )

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


class JobView(JobStatus):
    """``GET /v1/jobs/{id}``: the shared :class:`JobStatus` and where things are."""

    inputs: list[str] = Field(description="Each task's input (a URL without its password).")
    sidecars: list[str] = Field(description="Each task's results (JSON Lines).")
    pod_seconds: float = Field(description="The job's share of pod time so far.")
    duration_s: float | None = Field(description="Since its first task started.")
    serverless_tier: str | None = Field(None, description="Its serverless tier (else pods).")
    execution_s: float = Field(0.0, description="Worker seconds billed by its endpoint.")


def task_spec(rec: JobRecord, k: int) -> StreamSpec:
    """The stream that runs task ``k`` of ``rec``."""
    spec, task = rec.spec, rec.tasks[k]
    endpoint = rec.serverless.endpoint_id if rec.serverless is not None else None
    urls = rec.serverless.urls if rec.serverless is not None else None
    job = JobTask(
        job_id=rec.id,
        index=k,
        sidecar=task.sidecar,
        serverless_endpoint_id=endpoint,
        serverless_urls=urls,
    )
    return StreamSpec(
        id=task_stream_id(rec.id, k),
        url=task.input,
        priority=spec.priority,
        realtime=False,
        loop=False,
        fps=spec.fps or ALL_FRAMES_FPS,
        model=spec.model,
        job=job,
    )


def is_task(spec: StreamSpec) -> bool:
    """Whether ``spec`` runs a job's task (it carries a :class:`JobTask`)."""
    return spec.job is not None


# -- status ------------------------------------------------------------------------------


def eta_s(rec: JobRecord, tasks: Sequence[TaskProgress], done: int) -> float | None:
    """Seconds left at the rate of the recent samples; tasks whose total is not known yet
    count as the mean of those known. None until there is a rate or a total."""
    if not rec.active or len(rec.rate) < 2:
        return None
    (t0, f0), (t1, f1) = rec.rate[0], rec.rate[-1]
    known = [p.frames_total for p in tasks if p.frames_total is not None]
    if t1 <= t0 or f1 <= f0 or not known:
        return None
    total = sum(known) + sum(known) / len(known) * (len(tasks) - len(known))
    return round(max(0.0, total - done) / ((f1 - f0) / (t1 - t0)), 1)


def job_view(rec: JobRecord, progress: Sequence[TaskProgress | None], now: float) -> JobView:
    """The job as every reader sees it: its inputs, in ``spec`` too, without credentials
    (:func:`framerelay.redact.redact_url`), and no URL in an error unredacted."""
    tasks = [_task_progress(t, p) for t, p in zip(rec.tasks, progress, strict=True)]
    done = sum(p.frames_done for p in tasks)
    totals = [p.frames_total for p in tasks]
    end = rec.finished_at or now
    spec = rec.spec.model_copy(update={"inputs": [redact_url(i) for i in rec.spec.inputs]})
    return JobView(
        id=rec.id, spec=spec, state=rec.state, tasks=tasks, frames_done=done,
        frames_total=None if None in totals else sum(t or 0 for t in totals),
        submitted_at=rec.submitted_at, started_at=rec.started_at,
        finished_at=rec.finished_at, eta_s=eta_s(rec, tasks, done),
        cost_usd=round(rec.cost_usd, 6), error=redact_text(rec.error) if rec.error else None,
        inputs=[redact_url(t.input) for t in rec.tasks], sidecars=[t.sidecar for t in rec.tasks],
        pod_seconds=round(rec.pod_seconds, 1),
        duration_s=None if rec.started_at is None else round(max(0.0, end - rec.started_at), 1),
        serverless_tier=rec.serverless.tier if rec.serverless is not None else None,
        execution_s=round(sum(t.execution_s for t in rec.tasks), 3),
    )  # fmt: skip


def _task_progress(task: TaskRecord, said: TaskProgress | None) -> TaskProgress:
    """The ingest's progress (its error without a URL's credentials), else what the
    orchestrator knows of the task."""
    if said is not None:
        return said.model_copy(update={"error": redact_text(said.error)}) if said.error else said
    return TaskProgress() if task.state == "pending" else TaskProgress(state=task.state)


# -- store -------------------------------------------------------------------------------


@dataclass(slots=True)
class Changes:
    """Stream writes that go with a job's change, in its transaction."""

    put: list[StreamSpec] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)


class JobStore:
    """Jobs in the orchestrator's Redis; tasks' progress in the ingest's (``progress``)."""

    def __init__(self, store: Store, progress: Redis, progress_prefix: str) -> None:
        self.store = store
        self.r = store.r
        self.p = store.p
        self.progress_redis = progress
        self.progress_prefix = progress_prefix

    def key(self, job_id: str) -> str:
        return f"{self.p}job:{job_id}"

    async def submit(self, rec: JobRecord) -> bool:
        """Store a new job; False when one with its id exists."""
        if not await self.r.set(self.key(rec.id), rec.model_dump_json(), nx=True):
            return False
        await self.r.zadd(self.p + "jobs", {rec.id: rec.submitted_at})
        await self.r.sadd(self.p + "jobs:active", rec.id)
        return True

    async def get(self, job_id: str) -> JobRecord | None:
        raw = await self.r.get(self.key(job_id))
        return None if raw is None else JobRecord.model_validate_json(raw)

    async def ids(self, newest: int | None = None) -> list[str]:
        """Job ids, oldest first (``newest``: only the newest that many)."""
        raw = await self.r.zrange(self.p + "jobs", -newest if newest else 0, -1)
        return [i.decode() if isinstance(i, bytes) else str(i) for i in raw]

    async def active(self) -> list[JobRecord]:
        """The queued and running jobs, oldest first."""
        raw = await self.r.smembers(self.p + "jobs:active")
        ids = {i.decode() if isinstance(i, bytes) else str(i) for i in raw}
        return sorted((j for j in await self.many(ids) if j.active), key=lambda j: j.submitted_at)

    async def many(self, ids: Iterable[str]) -> list[JobRecord]:
        keys = [self.key(i) for i in ids]
        raws = await self.r.mget(keys) if keys else []
        return [JobRecord.model_validate_json(raw) for raw in raws if raw is not None]

    async def progress(self, rec: JobRecord) -> list[TaskProgress | None]:
        """Each task's progress as its ingest keeps it (None: not written yet)."""
        keys = [progress_key(self.progress_prefix, rec.id, k) for k in range(len(rec.tasks))]
        raws = await self.progress_redis.mget(keys)
        return [_progress(raw) for raw in raws]

    async def change(
        self, job_id: str, edit: Callable[[JobRecord], Changes | None]
    ) -> JobRecord | None:
        """Apply ``edit`` to the job and write it with its stream changes in one transaction
        (None: no such job, ``edit`` declined, or the job changed meanwhile: try again)."""
        key = self.key(job_id)
        async with self.r.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(key)
                raw = await pipe.get(key)
                if raw is None:
                    return None
                rec = JobRecord.model_validate_json(raw)
                changes = edit(rec)
                if changes is None:
                    return None
                pipe.multi()  # type: ignore[no-untyped-call]
                pipe.set(key, rec.model_dump_json())
                if not rec.active:
                    pipe.srem(self.p + "jobs:active", rec.id)
                for spec in changes.put:
                    pipe.hset(self.p + "streams", spec.id, spec.model_dump_json())
                for sid in changes.remove:  # as Store.del_stream
                    for part in ("streams", "assign", "pins"):
                        pipe.hdel(self.p + part, sid)
                await pipe.execute()
            except WatchError:
                return None
        return rec

    async def prune(self, keep: int) -> int:
        """Delete finished jobs beyond the newest ``keep``, with their tasks' keys."""
        active = {i.decode() if isinstance(i, bytes) else str(i)
                  for i in await self.r.smembers(self.p + "jobs:active")}  # fmt: skip
        done = [i for i in await self.ids() if i not in active]
        gone = await self.many(done[: max(0, len(done) - keep)])
        for rec in gone:
            keys = [f(self.progress_prefix, rec.id, k) for k in range(len(rec.tasks))
                    for f in (progress_key, checkpoint_key)]  # fmt: skip
            await self.progress_redis.delete(*keys)
            await self.r.delete(self.key(rec.id))
            await self.r.zrem(self.p + "jobs", rec.id)
        return len(gone)


def _progress(raw: bytes | str | None) -> TaskProgress | None:
    if raw is None:
        return None
    try:
        return TaskProgress.model_validate_json(raw)
    except ValueError:
        log.warning("a job task's progress in Redis is not TaskProgress JSON; ignored")
        return None


# -- the driver --------------------------------------------------------------------------


def advance(
    rec: JobRecord,
    progress: Sequence[TaskProgress | None],
    streams: Iterable[str],
    now: float,
    rates: tuple[float, float],
    window_s: float,
) -> Changes:
    """One pass over a job (pure): end the tasks their ingest finished, start the next
    ones, put back a running task's stream that went missing, charge the interval since
    the last pass (``rates``: $/s and pod-s/s; on a serverless tier: the execution time
    its ingest reports), keep the recent rate, and finish the job."""
    changes, have = Changes(), set(streams)
    _charge(rec, now, rates)
    _charge_execution(rec, progress)
    for k, task in enumerate(rec.tasks):
        said = progress[k]
        if task.state == "running" and said is not None and said.state in ("done", "failed"):
            task.state, task.finished_at = said.state, now
            changes.remove.append(task_stream_id(rec.id, k))
            if said.state == "failed" and rec.error is None:
                rec.error = f"task {k} failed: {said.error or 'no reason given'}"[:1000]
    running = sum(t.state == "running" for t in rec.tasks)
    for k, task in enumerate(rec.tasks):
        if task.state == "pending" and running < rec.spec.max_parallel:
            task.state, task.started_at, running = "running", now, running + 1
            changes.put.append(task_spec(rec, k))
        elif task.state == "running" and task_stream_id(rec.id, k) not in have:
            changes.put.append(task_spec(rec, k))  # removed by someone, or a new store
    if rec.started_at is None and running:
        rec.state, rec.started_at, rec.accrued_at = "running", now, now
    _sample(rec, progress, now, window_s)
    if all(t.state in ("done", "failed") for t in rec.tasks):
        failed = [k for k, t in enumerate(rec.tasks) if t.state == "failed"]
        rec.state, rec.finished_at = ("failed" if failed else "done"), now
    return changes


def _charge(rec: JobRecord, now: float, rates: tuple[float, float]) -> None:
    if rec.accrued_at is not None and now > rec.accrued_at:
        dt = now - rec.accrued_at
        rec.cost_usd += rates[0] * dt
        rec.pod_seconds += rates[1] * dt
    if rec.accrued_at is not None:
        rec.accrued_at = now


def _charge_execution(rec: JobRecord, progress: Sequence[TaskProgress | None]) -> None:
    """Charge the execution seconds the tasks' ingest added since the last pass."""
    if rec.serverless is None:
        return
    known = [t.execution_s for t in rec.tasks]
    for task, now_s, was in zip(rec.tasks, execution_s(progress, known), known, strict=True):
        task.execution_s = now_s
        rec.cost_usd += (now_s - was) * rec.serverless.price_per_s


def _sample(
    rec: JobRecord, progress: Sequence[TaskProgress | None], now: float, window_s: float
) -> None:
    done = sum(p.frames_done for p in progress if p is not None)
    rec.rate = [s for s in rec.rate if s[0] >= now - window_s and s[1] <= done]
    rec.rate = [*rec.rate, (now, done)][-MAX_RATE_SAMPLES:]


def cancel(rec: JobRecord, now: float) -> Changes | None:
    """Cancel an active job: its running tasks' streams go (None: it has ended already)."""
    if not rec.active:
        return None
    running = [task_stream_id(rec.id, k) for k, t in enumerate(rec.tasks) if t.state == "running"]
    rec.state, rec.finished_at = "cancelled", now
    rec.error = rec.error or "cancelled by DELETE /v1/jobs"
    return Changes(remove=running)


def job_rates(
    jobs: Sequence[JobRecord],
    pods: Mapping[str, PodRecord],
    assigned: Mapping[str, str],
    settings: OrchestratorSettings,
) -> dict[str, tuple[float, float]]:
    """Each active job's share of the fleet now: ($ per second, pod-seconds per second)."""
    workers = {w.name: rec for rec in pods.values() if rec.provider_id for w in rec.workers()}
    load = Counter(w for w in assigned.values() if w in workers)
    out: dict[str, tuple[float, float]] = {}
    for job in jobs:
        usd = pod = 0.0
        for k, task in enumerate(job.tasks):
            worker = assigned.get(task_stream_id(job.id, k)) if task.state == "running" else None
            if worker in workers:
                rec = workers[worker]
                share = 1.0 / (rec.gpu_count * load[worker])
                usd, pod = usd + rec.cost_per_hr / 3600 * share, pod + share
        out[job.id] = (usd, pod)
    idle = [r for r in pods.values() if _idle_batch(r, load, settings)]
    batch = [j.id for j in jobs if j.state == "running" and j.spec.priority == "batch"
             and j.serverless is None]  # fmt: skip
    for jid in batch:
        usd, pod = out[jid]
        out[jid] = (usd + sum(r.cost_per_hr for r in idle) / 3600 / len(batch),
                    pod + len(idle) / len(batch))  # fmt: skip
    return out


def _idle_batch(rec: PodRecord, load: Counter[str], settings: OrchestratorSettings) -> bool:
    tier = settings.tier(rec.tier)
    return (
        tier is not None and tier.batch_only and rec.provider_id is not None
        and rec.state != "draining" and not any(load[w.name] for w in rec.workers())
    )  # fmt: skip


class JobDriver:
    """Runs the jobs: one :meth:`tick` per reconcile pass of the leading orchestrator."""

    def __init__(self, settings: OrchestratorSettings, jobs: JobStore, clock: Clock) -> None:
        self.settings = settings
        self.jobs = jobs
        self.clock = clock

    async def tick(self) -> None:
        active = await self.jobs.active()
        if not active:
            return
        store = self.jobs.store
        pods, assigned = await store.pods(), await store.assignments()
        rates = job_rates(active, pods, assigned, self.settings)
        streams = set(await store.streams())
        ended = 0
        for rec in active:
            ended += await self._advance(rec, streams, rates[rec.id])
        if ended:
            await self.jobs.prune(self.settings.jobs.keep_finished)

    async def _advance(self, rec: JobRecord, streams: set[str], rates: tuple[float, float]) -> bool:
        """One pass over ``rec``; True when it ended."""
        progress = await self.jobs.progress(rec)
        now, window = self.clock.now(), self.settings.jobs.eta_window_s
        was = rec.state

        def edit(r: JobRecord) -> Changes | None:
            return advance(r, progress, streams, now, rates, window) if r.active else None

        after = await self.jobs.change(rec.id, edit)
        if after is not None and after.serverless is not None:
            spent = after.cost_usd - rec.cost_usd  # pods charge nothing to such a job
            await self.jobs.store.add_cost(serverless_spend(after.serverless.tier, spent))
        if after is not None and after.state != was:
            log.info("job %s: %s -> %s (cost $%.4f)", rec.id, was, after.state, after.cost_usd)
        return after is not None and not after.active


# -- placement ---------------------------------------------------------------------------


def placement_view(
    settings: OrchestratorSettings,
    streams: Iterable[StreamSpec],
    pods: Mapping[str, PodRecord],
    prices: Mapping[str, GpuPrice],
) -> list[StreamSpec]:
    """The streams as the scaler and placement weigh them: a job task claims one whole
    worker (the room of the smallest worker, planned or ready, of the tiers it may run
    on), whatever its sampling rate; a task on a serverless endpoint is left out (no pod
    serves it: :mod:`deploy.serverless_jobs`); live streams as they are."""
    out, pinned = [], batch_pinned(settings)
    for spec in streams:
        if endpoint_of(spec) is not None:
            continue
        if not is_task(spec):
            out.append(spec)
            continue
        tiers = [
            t
            for t in settings.tiers
            if t.rents_pods and allowed(spec, not t.takes_critical, t.batch_only, pinned)
        ]
        rooms = [per_worker(settings, t, pods.values(), expected_fps(settings, t, prices))
                 for t in tiers]  # fmt: skip
        rooms += [t.capacity_fps or w.capacity_fps or settings.default_capacity_fps
                  for t in tiers for p in pods.values() if p.tier == t.name
                  for w in p.workers() if w.ready]  # fmt: skip
        room = min(rooms, default=0.0) * settings.target_utilization
        cost = settings.model_costs.get(spec.model, 1.0)
        if room > 0 and math.isfinite(room):
            spec = spec.model_copy(update={"fps": room / cost})
        out.append(spec)
    return out
