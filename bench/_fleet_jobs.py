"""A night of batch jobs (issue 18): a spot tier scaled from zero, against on-demand
and against always-on workers.

Eight jobs re-process recordings (1-3 cameras' recorder segments of an hour each, 8-24
hours a camera, sampled at 2 or 5 fps, ``yolox_nano`` or ``ppe``) submitted between
22:00 and 02:00 (Europe/Paris). As in ``framerelay.jobs``, each input is a task run as a
``batch`` stream ``job-<job>-<k>`` at full speed: the task's stream asks for one
worker's room (capacity x target utilisation, in the task's model), so it gets a worker
of its own; a job runs at most ``max_parallel`` (4) tasks at once.

The policy is the orchestrator's own, called every tick (30 s) of a simulated clock:
``deploy.scaling.tier_targets`` (workers per tier from the demand, the schedule's
``may_run``/``warm_target`` and the GPU catalog's capacity of the type
``deploy.sizing`` ranks first, L4 here), the fleet's shrink order (starting pods first,
then idle ones; a pod with a task is never stopped), ``deploy.placement.place`` (tasks
onto ready workers, no churn) and ``deploy.cost.accrue`` (billing). The simulator adds
only what the cloud and the ingest do: a pod is billed per second from its creation and
takes ``startup_s`` to warm up; a task's checkpoint moves every ``checkpoint_s`` of its
work; a spot pod is preempted at a seeded rate per pod-hour, at a random instant of a
tick, and the task it ran starts over from its checkpoint on another worker (the frames
since are processed again: ``redone_frames``).

Three plans, the same jobs, prices from the contract server's catalog:

* ``spot_scale_to_zero``: framerelay's plan - a batch-only community-spot tier with no
  worker until there is work, back to zero when the queue is empty;
* ``ondemand_scale_to_zero``: the same tier and scaler on secure on-demand (no
  preemption): the spot lever alone;
* ``always_on``: a fixed pool of on-demand workers, as many as the on-demand plan's peak,
  warm all night (20:00-08:00, a tier window; warmed ``startup_s`` ahead).

Imported by ``bench/fleet.py``; pure computation, seeded and deterministic.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bench._fleet_sizing import MODELS, SEEN, SIZING, TZ
from deploy.cost import CostTotals, PaidPod, accrue
from deploy.models import StreamSpec
from deploy.placement import Slot, place
from deploy.providers.base import GpuPrice
from deploy.scaling import per_worker, tier_targets
from deploy.schedule import in_window
from deploy.settings import OrchestratorSettings, TierConfig, Window
from deploy.sizing import expected_fps, rank
from framerelay.jobs import JobSpec, task_stream_id

if TYPE_CHECKING:
    from matplotlib.figure import Figure

START = dt.datetime(2026, 3, 2, 19, 30, tzinfo=TZ)  # a Monday evening
FIRST_SUBMIT, LAST_SUBMIT = dt.time(22, 0), dt.time(2, 0)
NIGHT = Window(days=(0, 1, 2, 3, 4, 5, 6), start=dt.time(20, 0), end=dt.time(8, 0))
HORIZON_S = 36 * 3600.0
N_JOBS, MAX_PARALLEL, SEGMENT_S = 8, 4, 3600.0
MAX_WORKERS = 12
STARTUP_S = 300.0
CHECKPOINT_S = 30.0
PREEMPT_PER_POD_H = 0.15
SEED = 18
TICK_S = 30.0
PLANS = ("spot_scale_to_zero", "ondemand_scale_to_zero", "always_on")


@dataclass(frozen=True, slots=True)
class NightJob:
    """A job as submitted (the shared contract's :class:`JobSpec`) and when."""

    id: str
    spec: JobSpec
    submitted_s: float
    """Seconds after :data:`START`."""

    @property
    def frames_per_task(self) -> int:
        return round(SEGMENT_S * self.spec.fps)


def night_jobs(seed: int = SEED) -> list[NightJob]:
    """The night's jobs, drawn from ``seed``: evenly submitted from 22:00 to 02:00."""
    rng = random.Random(seed)
    first_at = dt.datetime.combine(START.date(), FIRST_SUBMIT, TZ)
    last_at = dt.datetime.combine(START.date() + dt.timedelta(days=1), LAST_SUBMIT, TZ)
    first, span = (first_at - START).total_seconds(), (last_at - first_at).total_seconds()
    jobs = []
    for i in range(N_JOBS):
        cameras, hours, fps = rng.randint(1, 3), rng.choice((8, 12, 24)), rng.choice((2.0, 5.0))
        inputs = [f"/recordings/site-{i}/cam-{c}/2026-03-01T{h:02d}.mp4"
                  for c in range(cameras) for h in range(hours)]  # fmt: skip
        spec = JobSpec(id=f"night-{i}", inputs=inputs, model=MODELS[i % len(MODELS)], fps=fps,
                       priority="batch", max_parallel=MAX_PARALLEL)  # fmt: skip
        jobs.append(NightJob(spec.id or "", spec, first + span * i / (N_JOBS - 1)))
    return jobs


@dataclass(frozen=True, slots=True)
class Plan:
    """One way to run the night: its tier and its preemption rate."""

    name: str
    tier: TierConfig
    preempt_per_pod_h: float = 0.0


def plan_tier(name: str, *, spot: bool, pool: int = 0) -> TierConfig:
    """A batch-only tier of both GPU types hosting both models; ``pool`` > 0: that many
    workers kept warm through :data:`NIGHT` (and no more)."""
    windows = (NIGHT.model_copy(update={"min_warm": pool}),) if pool else ()
    return TierConfig(
        name=name, spot=spot, cloud_types=("COMMUNITY",) if spot else ("SECURE",),
        gpu_types=("NVIDIA RTX A4000", "NVIDIA L4"), models=MODELS, batch_only=True,
        max_workers=pool or MAX_WORKERS, windows=windows, lead_s=STARTUP_S,
    )  # fmt: skip


@dataclass(slots=True)
class _Task:
    """One input of a job: its stream (at full speed), frames, progress, checkpoint."""

    stream: StreamSpec
    total: int
    done: float = 0.0
    checkpoint: int = 0
    finished_at: float | None = None


@dataclass(slots=True)
class _Pod:
    """A rented worker: warm from ``ready_at``, running ``task`` (a stream id) or idle."""

    name: str
    ready_at: float
    task: str | None = None


@dataclass(slots=True)
class _Night:
    """One plan's night as it goes (times: epoch seconds)."""

    plan: Plan
    settings: OrchestratorSettings
    price: GpuPrice
    jobs: list[NightJob]
    tasks: dict[str, _Task]
    rng: random.Random
    pods: dict[str, _Pod] = field(default_factory=dict)
    flat: dict[str, float] = field(default_factory=dict)
    made: int = 0
    preemptions: int = 0
    redone: int = 0
    peak: int = 0
    series: list[tuple[float, int]] = field(default_factory=list)
    """(hours after :data:`START`, pods) at each change."""

    @property
    def tier(self) -> TierConfig:
        return self.plan.tier


def _settings(tier: TierConfig) -> OrchestratorSettings:
    return OrchestratorSettings(tiers=[tier], timezone=str(TZ), tick_s=TICK_S, **SIZING)


def task_fps(settings: OrchestratorSettings, tier: TierConfig, model: str) -> int:
    """A task's full speed: one worker's room in ``model`` (whole frames a second)."""
    capacity = per_worker(settings, tier, [], expected_fps(settings, tier, SEEN))
    return max(1, math.floor(capacity * settings.target_utilization
                             / settings.model_costs.get(model, 1.0)))  # fmt: skip


def _start(plan: Plan, jobs: list[NightJob], seed: int) -> _Night:
    settings = _settings(plan.tier)
    gpu = rank(settings, plan.tier, SEEN)[0].gpu_type
    tasks = {}
    for job in jobs:
        fps = task_fps(settings, plan.tier, job.spec.model)
        for k, segment in enumerate(job.spec.inputs):
            sid = task_stream_id(job.id, k)
            stream = StreamSpec(id=sid, url=segment, priority="batch", fps=fps,
                                model=job.spec.model, realtime=False)  # fmt: skip
            tasks[sid] = _Task(stream, job.frames_per_task)
    return _Night(plan, settings, SEEN[gpu], jobs, tasks, random.Random(seed))


def _runnable(night: _Night, now: float) -> list[StreamSpec]:
    """Each submitted job's first ``max_parallel`` unfinished tasks."""
    out = []
    for job in night.jobs:
        if START.timestamp() + job.submitted_s > now:
            continue
        ids = (task_stream_id(job.id, k) for k in range(len(job.spec.inputs)))
        left = [night.tasks[s] for s in ids if night.tasks[s].finished_at is None]
        out += [t.stream for t in left[: job.spec.max_parallel]]
    return out


def _scale(night: _Night, streams: list[StreamSpec], now: float) -> None:
    """The scaler's target for the tier; grow, or stop the fleet's shrink order's idle
    pods (starting first, then ready ones)."""
    target = tier_targets(night.settings, streams, {}, SEEN, now)[night.tier.name]
    while len(night.pods) < target:
        name = f"{night.tier.name}-{night.made}"
        night.pods[name] = _Pod(name, now + STARTUP_S)
        night.made += 1
    extra = len(night.pods) - target
    idle = sorted((p for p in night.pods.values() if p.task is None),
                  key=lambda p: (p.ready_at <= now, p.name))  # fmt: skip
    for pod in idle[: max(0, extra)]:
        del night.pods[pod.name]
    night.peak = max(night.peak, len(night.pods))


def _place(night: _Night, streams: list[StreamSpec], now: float) -> None:
    """Placement's answer on the ready workers (a batch-only tier's only in its windows)."""
    tier, usd = night.tier, night.price.price(night.tier.cloud_types[0], night.tier.spot)
    room = per_worker(night.settings, tier, [], expected_fps(night.settings, tier, SEEN))
    open_ = not tier.windows or in_window(tier, now, TZ)
    ready = [p for p in night.pods.values() if p.ready_at <= now and open_]
    slots = [Slot(p.name, tier.name, tier.spot, room * night.settings.target_utilization, usd,
                  batch_only=True) for p in ready]  # fmt: skip
    current = {p.task: p.name for p in night.pods.values()
               if p.task is not None and night.tasks[p.task].finished_at is None}  # fmt: skip
    result = place(streams, slots, current, night.settings.model_costs, batch_pinned=True)
    for sid, (old, _new) in result.moves(current).items():
        if old is not None:  # moved or left: it restarts from its checkpoint
            _restart(night, night.tasks[sid])
    for pod in night.pods.values():
        pod.task = None
    for sid, name in result.assign.items():
        night.pods[name].task = sid


def _restart(night: _Night, task: _Task) -> None:
    lost = math.floor(task.done) - task.checkpoint
    night.redone += max(0, lost)
    task.done = float(task.checkpoint)


def _work(night: _Night, task: _Task, start: float, seconds: float) -> None:
    """``seconds`` of the task's work from ``start``; its checkpoint follows."""
    fps = task.stream.fps
    left = task.total - task.done
    if fps * seconds >= left:
        task.done, task.checkpoint = float(task.total), task.total
        task.finished_at = start + left / fps
        return
    task.done += fps * seconds
    every = fps * CHECKPOINT_S
    task.checkpoint = int(math.floor(task.done / every) * every)


def _advance(night: _Night, now: float) -> None:
    """One tick: every pod works and is billed; a spot pod may be preempted within it."""
    usd = night.price.price(night.tier.cloud_types[0], night.tier.spot)
    p = 1.0 - math.exp(-night.plan.preempt_per_pod_h * TICK_S / 3600)
    for name in sorted(night.pods):
        pod = night.pods[name]
        preempted = night.tier.spot and night.rng.random() < p
        seconds = night.rng.random() * TICK_S if preempted else TICK_S
        task = night.tasks[pod.task] if pod.task is not None else None
        if task is not None:
            _work(night, task, now, seconds)
        paid = PaidPod(night.tier.name, night.tier.spot, usd, night.price.ondemand)
        for key, inc in accrue([paid], int(task is not None), seconds).items():
            night.flat[key] = night.flat.get(key, 0.0) + inc
        if preempted:
            night.preemptions += 1
            if task is not None and task.finished_at is None:
                _restart(night, task)
            del night.pods[name]


def _done(night: _Night, now: float) -> bool:
    submitted = all(START.timestamp() + j.submitted_s <= now for j in night.jobs)
    finished = all(t.finished_at is not None for t in night.tasks.values())
    return submitted and finished and not night.pods


def _clock() -> Iterator[float]:
    now, end = START.timestamp(), START.timestamp() + HORIZON_S
    while now < end:
        yield now
        now += TICK_S


def run_plan(plan: Plan, jobs: list[NightJob], seed: int = SEED) -> dict[str, Any]:
    """The night of ``jobs`` on ``plan``, tick by tick until the queue is empty and the
    tier is back to zero (or :data:`HORIZON_S`)."""
    night = _start(plan, jobs, seed)
    now = START.timestamp()
    for now in _clock():
        if _done(night, now):
            break
        streams = _runnable(night, now)
        _scale(night, streams, now)
        _place(night, streams, now)
        _mark(night, now)
        _advance(night, now)
        _mark(night, now + TICK_S)
    return _summary(night, now)


def _mark(night: _Night, now: float) -> None:
    if not night.series or night.series[-1][1] != len(night.pods):
        night.series.append((round((now - START.timestamp()) / 3600, 4), len(night.pods)))


def _local(t: float) -> str:
    return dt.datetime.fromtimestamp(t, TZ).strftime("%H:%M")


def _summary(night: _Night, now: float) -> dict[str, Any]:
    cost = CostTotals.from_flat(night.flat)
    tasks = night.tasks.values()
    done = [t.finished_at for t in tasks if t.finished_at is not None]
    last = max(done, default=None)
    first = START.timestamp() + min(j.submitted_s for j in night.jobs)
    processed = sum(t.total for t in tasks if t.finished_at is not None)
    return {
        "tier": night.tier.name, "gpu_type": night.price.gpu_type, "spot": night.tier.spot,
        "usd_per_gpu_hr": night.price.price(night.tier.cloud_types[0], night.tier.spot),
        "usd": round(cost.fleet_usd, 4), "gpu_hours": round(cost.pod_seconds / 3600, 3),
        "pods_created": night.made, "peak_pods": night.peak, "pods_at_end": len(night.pods),
        "ended": _local(now), "preemptions": night.preemptions, "redone_frames": night.redone,
        "frames_total": sum(t.total for t in tasks), "frames_processed": processed,
        "frames_sent": processed + night.redone,
        "tasks_done": len(done), "tasks": len(night.tasks),
        "last_job_done": _local(last) if last is not None else None,
        "last_job_done_h_after_first_submit": round((last - first) / 3600, 3) if last else None,
        "pods_over_time": [list(point) for point in night.series],
    }  # fmt: skip


def _ratio(a: float, b: float) -> float:
    return round(a / b, 4) if b > 0 else math.inf


def night(seed: int = SEED, preempt_per_pod_h: float = PREEMPT_PER_POD_H) -> dict[str, Any]:
    """The three plans over the same seeded night, and the spot plan's cost ratios."""
    if not (math.isfinite(preempt_per_pod_h) and 0 <= preempt_per_pod_h <= 10):
        raise ValueError(f"preemptions per pod-hour: 0..10, not {preempt_per_pod_h}")
    jobs = night_jobs(seed)
    spot = run_plan(Plan(PLANS[0], plan_tier("spot-batch", spot=True), preempt_per_pod_h),
                    jobs, seed)  # fmt: skip
    ondemand = run_plan(Plan(PLANS[1], plan_tier("od-batch", spot=False)), jobs, seed)
    pool = max(1, ondemand["peak_pods"])
    always = run_plan(Plan(PLANS[2], plan_tier("always-on", spot=False, pool=pool)), jobs, seed)
    return {
        "jobs": [{"id": j.id, "model": j.spec.model, "fps": j.spec.fps,
                  "segments": len(j.spec.inputs), "frames": j.frames_per_task * len(j.spec.inputs),
                  "submitted": _local(START.timestamp() + j.submitted_s)} for j in jobs],
        "plans": dict(zip(PLANS, (spot, ondemand, always), strict=True)),
        "always_on_workers": pool,
        "ratio_spot_vs_ondemand": _ratio(spot["usd"], ondemand["usd"]),
        "ratio_spot_vs_always_on": _ratio(spot["usd"], always["usd"]),
        "parameters": {"seed": seed, "preempt_per_pod_h": preempt_per_pod_h, "tick_s": TICK_S,
                       "startup_s": STARTUP_S, "checkpoint_s": CHECKPOINT_S,
                       "max_workers": MAX_WORKERS, "max_parallel": MAX_PARALLEL,
                       "segment_s": SEGMENT_S, "night": "20:00-08:00 Europe/Paris"},
    }  # fmt: skip


LABELS = {"spot_scale_to_zero": "spot, scale to zero (framerelay)",
          "ondemand_scale_to_zero": "on-demand, scale to zero",
          "always_on": "always-on on-demand pool"}  # fmt: skip


def report(out: dict[str, Any]) -> None:
    jobs = out["jobs"]
    frames = sum(j["frames"] for j in jobs)
    hours = sum(j["segments"] for j in jobs) * out["parameters"]["segment_s"] / 3600
    p = out["parameters"]
    print(f"a night of jobs: {len(jobs)} jobs, {hours:.0f} h of recordings, {frames:,} frames, "
          f"submitted {jobs[0]['submitted']}-{jobs[-1]['submitted']}; seed {p['seed']}, "
          f"{p['preempt_per_pod_h']} spot preemptions per pod-hour, pods warm in "
          f"{p['startup_s']:.0f} s")  # fmt: skip
    print(
        f"  {'plan':34s} {'cost':>8s} {'GPU-h':>7s} {'pods':>5s} {'preempted':>9s} "
        f"{'redone frames':>13s} {'frames done':>12s} {'last job done':>13s} {'at end':>6s}"
    )
    for key, row in out["plans"].items():
        label = LABELS[key] + (f" x{out['always_on_workers']}" if key == "always_on" else "")
        print(f"  {label:34s} ${row['usd']:7.2f} {row['gpu_hours']:7.1f} {row['peak_pods']:5d} "
              f"{row['preemptions']:9d} {row['redone_frames']:13,d} "
              f"{row['frames_processed']:12,d} {row['last_job_done'] or '-':>13s} "
              f"{row['pods_at_end']:6d}")  # fmt: skip
    print(
        f"  spot plan / on-demand scale-to-zero {out['ratio_spot_vs_ondemand']:.3f}; "
        f"spot plan / always-on {out['ratio_spot_vs_always_on']:.3f}"
    )


COLORS = {"spot_scale_to_zero": "tab:green", "ondemand_scale_to_zero": "tab:orange",
          "always_on": "tab:red"}  # fmt: skip


def plot(fig: Figure, out: dict[str, Any]) -> None:
    """Pods through the night per plan; the night's three bills."""
    pods, bills = fig.subplots(1, 2, width_ratios=(2, 1))
    for key, row in out["plans"].items():
        hours, counts = zip(*row["pods_over_time"], strict=True)
        pods.step(hours, counts, where="post", label=LABELS[key], color=COLORS[key],
                  linestyle="--" if key == "ondemand_scale_to_zero" else "-")  # fmt: skip
    pods.set(xlabel=f"hours after {START:%H:%M} (Europe/Paris)", ylabel="pods",
             title="the night's workers")  # fmt: skip
    pods.set_ylim(0, out["always_on_workers"] * 1.4)
    pods.legend(loc="upper right")
    usd = [row["usd"] for row in out["plans"].values()]
    bars = bills.barh([LABELS[k].replace(", ", ",\n") for k in out["plans"]], usd,
                      color=[COLORS[k] for k in out["plans"]])  # fmt: skip
    bills.bar_label(bars, fmt="$%.2f", padding=2)
    bills.set_xlim(0, max(usd) * 1.3)
    bills.set(xlabel="USD for the night", title="the night's bill")
