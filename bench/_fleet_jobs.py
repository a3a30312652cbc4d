"""A night of batch jobs on RunPod as it is: community pods, secure pods or a serverless
endpoint, each from zero, against always-on secure pods.

Eight jobs re-process recordings (1-3 cameras' recorder segments of an hour each, 8-24
hours a camera, sampled at 2 or 5 fps, ``yolox_nano`` or ``ppe``) submitted between
22:00 and 02:00 (Europe/Paris). As in ``framerelay.jobs``, each input is a task run as a
``batch`` stream ``job-<job>-<k>`` at full speed: the task's stream asks for one
worker's room (capacity x target utilisation, in the task's model), so it gets a worker
of its own; a job runs at most ``max_parallel`` (4) tasks at once.

The policy is the orchestrator's own, called every tick (30 s) of a simulated clock:
``deploy.scaling.tier_targets`` (workers per tier from the demand, the schedule's
``may_run``/``warm_target`` and the GPU catalog's capacity of the type
``deploy.sizing`` ranks first, L4 here), the fleet's shrink order (starting workers
first, then idle ones; a worker with a task is never stopped), ``deploy.placement.place``
(tasks onto ready workers, no churn) and ``deploy.cost.accrue`` (billing). The simulator
adds only what the cloud and the ingest do: a pod is billed per second from its creation
and takes :data:`STARTUP_S` to warm up; a task's checkpoint moves every
:data:`CHECKPOINT_S` of its work.

RunPod has no spot or interruptible pods: nothing is preempted. Its community cloud is
cheaper and its hosts are less reliable, so a community pod's **host may be lost**
(the pod vanishes) at a seeded rate per pod-hour (:data:`HOST_LOST_PER_POD_H`, an
assumption, not a published figure), at a random instant of a tick; the task it ran
starts over from its checkpoint on another worker (the frames since are processed
again: ``redone_frames``).

Four plans, the same jobs, prices from RunPod's catalog (:mod:`bench._fleet_catalog`):

* ``community_scale_to_zero``: framerelay's plan - a batch-only tier on the community
  cloud with no pod until there is work, back to zero when the queue is empty;
* ``secure_scale_to_zero``: the same tier and scaler on the secure cloud (no host lost);
* ``serverless``: the tasks on a RunPod serverless endpoint (queue-based: a worker per
  queued task up to the same :data:`MAX_WORKERS`, the same scaler standing in for
  RunPod's), at the catalog's serverless price of the type ranked first at that price.
  A worker is billed as RunPod bills one: from its start (:data:`SERVERLESS_START_S`:
  the container and the model loading, an assumption), through its execution, until
  :data:`IDLE_TIMEOUT_S` after it ran out of work. ``execution_usd`` is the execution
  seconds alone at that price (RunPod's ``executionTime``, what framerelay's job
  accounting charges a serverless job);
* ``always_on_secure``: a fixed pool of secure pods, as many as the secure plan's peak,
  warm all night (20:00-08:00, a tier window; warmed :data:`STARTUP_S` ahead).

A task runs at the same speed in every plan, so the work's GPU-seconds are the same and
the plans differ by price, warm-ups, idle time and lost hosts.

Imported by ``bench/fleet.py``; pure computation, seeded and deterministic.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from bench._fleet_catalog import read_catalog
from bench._fleet_sizing import MODELS, SIZING, TZ
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
"""A pod's warm-up: placed, image pulled, worker started (billed)."""
SERVERLESS_START_S = 60.0
"""A serverless worker's start: container and model loading (billed; an assumption)."""
IDLE_TIMEOUT_S = 5.0
"""A serverless worker's idle timeout (RunPod's default; billed)."""
CHECKPOINT_S = 30.0
HOST_LOST_PER_POD_H = 0.15
SEED = 18
TICK_S = 30.0
GPU_TYPES = ("NVIDIA RTX A4000", "NVIDIA L4")
PLANS = ("community_scale_to_zero", "secure_scale_to_zero", "serverless", "always_on_secure")
Capacity = Literal["COMMUNITY", "SECURE", "SERVERLESS"]
Prices = Mapping[str, GpuPrice]


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
        inputs = [
            f"/recordings/site-{i}/cam-{c}/2026-03-01T{h:02d}.mp4"
            for c in range(cameras)
            for h in range(hours)
        ]
        spec = JobSpec(
            id=f"night-{i}",
            inputs=inputs,
            model=MODELS[i % len(MODELS)],
            fps=fps,
            priority="batch",
            max_parallel=MAX_PARALLEL,
        )
        jobs.append(NightJob(spec.id or "", spec, first + span * i / (N_JOBS - 1)))
    return jobs


@dataclass(frozen=True, slots=True)
class Plan:
    """One way to run the night: its tier, what it rents, how often a host is lost."""

    name: str
    tier: TierConfig
    capacity: Capacity
    host_lost_per_pod_h: float = 0.0

    @property
    def serverless(self) -> bool:
        return self.capacity == "SERVERLESS"

    @property
    def startup_s(self) -> float:
        return SERVERLESS_START_S if self.serverless else STARTUP_S


def plan_tier(name: str, cloud: str, pool: int = 0) -> TierConfig:
    """A batch-only tier of both GPU types hosting both models on ``cloud``; ``pool`` > 0:
    that many workers kept warm through :data:`NIGHT` (and no more)."""
    windows = (NIGHT.model_copy(update={"min_warm": pool}),) if pool else ()
    return TierConfig(
        name=name,
        cloud_types=(cloud,),
        gpu_types=GPU_TYPES,
        models=MODELS,
        batch_only=True,
        max_workers=pool or MAX_WORKERS,
        windows=windows,
        lead_s=STARTUP_S,
    )


def seen_prices(plan: Plan, prices: Prices) -> dict[str, GpuPrice]:
    """The prices the plan's sizing and scaler read: the catalog's, or for the serverless
    plan each type's serverless price (as its clouds' prices, which they rank by)."""
    if not plan.serverless:
        return dict(prices)
    return {
        g: GpuPrice(g, p.serverless or 0.0, p.serverless or 0.0, serverless=p.serverless)
        for g, p in prices.items()
    }


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
    """A rented worker (a pod, or a serverless worker): warm from ``ready_at``, running
    ``task`` (a stream id) or idle."""

    name: str
    ready_at: float
    task: str | None = None


@dataclass(slots=True)
class _Night:
    """One plan's night as it goes (times: epoch seconds)."""

    plan: Plan
    settings: OrchestratorSettings
    seen: dict[str, GpuPrice]
    price: GpuPrice
    usd_per_hr: float
    """The plan's price of one GPU-hour of the chosen type (the catalog's)."""
    jobs: list[NightJob]
    tasks: dict[str, _Task]
    rng: random.Random
    pods: dict[str, _Pod] = field(default_factory=dict)
    flat: dict[str, float] = field(default_factory=dict)
    made: int = 0
    hosts_lost: int = 0
    redone: int = 0
    peak: int = 0
    execution_s: float = 0.0
    series: list[tuple[float, int]] = field(default_factory=list)
    """(hours after :data:`START`, workers) at each change."""

    @property
    def tier(self) -> TierConfig:
        return self.plan.tier


def _settings(tier: TierConfig) -> OrchestratorSettings:
    return OrchestratorSettings(tiers=[tier], timezone=str(TZ), tick_s=TICK_S, **SIZING)


def task_fps(settings: OrchestratorSettings, tier: TierConfig, model: str, seen: Prices) -> int:
    """A task's full speed: one worker's room in ``model`` (whole frames a second)."""
    capacity = per_worker(settings, tier, [], expected_fps(settings, tier, seen))
    weight = settings.model_costs.get(model, 1.0)
    return max(1, math.floor(capacity * settings.target_utilization / weight))


def _start(plan: Plan, jobs: list[NightJob], prices: Prices, seed: int) -> _Night:
    settings = _settings(plan.tier)
    seen = seen_prices(plan, prices)
    gpu = rank(settings, plan.tier, seen)[0].gpu_type
    tasks = {}
    for job in jobs:
        fps = task_fps(settings, plan.tier, job.spec.model, seen)
        for k, segment in enumerate(job.spec.inputs):
            sid = task_stream_id(job.id, k)
            stream = StreamSpec(
                id=sid, url=segment, priority="batch", fps=fps, model=job.spec.model, realtime=False
            )
            tasks[sid] = _Task(stream, job.frames_per_task)
    price = prices[gpu]
    usd = price.serverless if plan.serverless else price.price(plan.capacity, False)
    if usd is None:
        raise RuntimeError(f"RunPod's catalog sells no serverless {gpu}")
    return _Night(plan, settings, seen, price, usd, jobs, tasks, random.Random(seed))


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
    workers (starting first, then ready ones)."""
    target = tier_targets(night.settings, streams, {}, night.seen, now)[night.tier.name]
    while len(night.pods) < target:
        name = f"{night.tier.name}-{night.made}"
        night.pods[name] = _Pod(name, now + night.plan.startup_s)
        night.made += 1
    extra = len(night.pods) - target
    idle = sorted(
        (p for p in night.pods.values() if p.task is None),
        key=lambda p: (p.ready_at <= now, p.name),
    )
    for pod in idle[: max(0, extra)]:
        del night.pods[pod.name]
    night.peak = max(night.peak, len(night.pods))


def _place(night: _Night, streams: list[StreamSpec], now: float) -> None:
    """Placement's answer on the ready workers (a batch-only tier's only in its windows)."""
    tier, settings = night.tier, night.settings
    room = per_worker(settings, tier, [], expected_fps(settings, tier, night.seen))
    open_ = not tier.windows or in_window(tier, now, TZ)
    ready = [p for p in night.pods.values() if p.ready_at <= now and open_]
    slots = [
        Slot(
            p.name,
            tier.name,
            False,
            room * settings.target_utilization,
            night.usd_per_hr,
            batch_only=True,
        )
        for p in ready
    ]
    current = {
        p.task: p.name
        for p in night.pods.values()
        if p.task is not None and night.tasks[p.task].finished_at is None
    }
    result = place(streams, slots, current, settings.model_costs, batch_pinned=True)
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


def _work(task: _Task, start: float, seconds: float) -> float:
    """``seconds`` of the task's work from ``start`` (its checkpoint follows); the
    seconds it worked (fewer when it finished)."""
    fps = task.stream.fps
    left = task.total - task.done
    if fps * seconds >= left:
        task.done, task.checkpoint = float(task.total), task.total
        task.finished_at = start + left / fps
        return left / fps
    task.done += fps * seconds
    every = fps * CHECKPOINT_S
    task.checkpoint = int(math.floor(task.done / every) * every)
    return seconds


def _billed(night: _Night, pod: _Pod, now: float, task: _Task | None, worked: float) -> float:
    """Seconds of this tick the worker is billed: a pod, all of them; a serverless worker
    while it starts and works, and :data:`IDLE_TIMEOUT_S` once it ran out of work."""
    if not night.plan.serverless or pod.ready_at > now:
        return TICK_S
    if task is not None and task.finished_at is None:
        return TICK_S
    return min(TICK_S, worked + IDLE_TIMEOUT_S)


def _advance(night: _Night, now: float) -> None:
    """One tick: every worker works and is billed; a host may be lost within it."""
    p = 1.0 - math.exp(-night.plan.host_lost_per_pod_h * TICK_S / 3600)
    for name in sorted(night.pods):
        pod = night.pods[name]
        lost = night.plan.host_lost_per_pod_h > 0 and night.rng.random() < p
        seconds = night.rng.random() * TICK_S if lost else TICK_S
        task = night.tasks[pod.task] if pod.task is not None else None
        worked = _work(task, now, seconds) if task is not None else 0.0
        night.execution_s += worked
        billed = min(seconds, _billed(night, pod, now, task, worked))
        paid = PaidPod(night.tier.name, False, night.usd_per_hr, night.price.ondemand)
        for key, inc in accrue([paid], int(task is not None), billed).items():
            night.flat[key] = night.flat.get(key, 0.0) + inc
        if lost:
            night.hosts_lost += 1
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


def run_plan(plan: Plan, jobs: list[NightJob], prices: Prices, seed: int = SEED) -> dict[str, Any]:
    """The night of ``jobs`` on ``plan``, tick by tick until the queue is empty and the
    tier is back to zero (or :data:`HORIZON_S`)."""
    night = _start(plan, jobs, prices, seed)
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
        "tier": night.tier.name,
        "capacity": night.plan.capacity,
        "gpu_type": night.price.gpu_type,
        "usd_per_gpu_hr": night.usd_per_hr,
        "usd": round(cost.fleet_usd, 4),
        "gpu_hours": round(cost.pod_seconds / 3600, 3),
        "execution_hours": round(night.execution_s / 3600, 3),
        "execution_usd": round(night.execution_s * night.usd_per_hr / 3600, 4),
        "workers_started": night.made,
        "peak_pods": night.peak,
        "pods_at_end": len(night.pods),
        "ended": _local(now),
        "hosts_lost": night.hosts_lost,
        "redone_frames": night.redone,
        "frames_total": sum(t.total for t in tasks),
        "frames_processed": processed,
        "frames_sent": processed + night.redone,
        "tasks_done": len(done),
        "tasks": len(night.tasks),
        "last_job_done": _local(last) if last is not None else None,
        "last_job_done_h_after_first_submit": round((last - first) / 3600, 3) if last else None,
        "pods_over_time": [list(point) for point in night.series],
    }


def _ratio(a: float, b: float) -> float:
    return round(a / b, 4) if b > 0 else math.inf


def _ratios(plans: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    usd = {key: row["usd"] for key, row in plans.items()}
    community, secure = usd["community_scale_to_zero"], usd["secure_scale_to_zero"]
    serverless, always = usd["serverless"], usd["always_on_secure"]
    return {
        "community_vs_secure": _ratio(community, secure),
        "community_vs_always_on": _ratio(community, always),
        "serverless_vs_community": _ratio(serverless, community),
        "serverless_vs_secure": _ratio(serverless, secure),
        "serverless_vs_always_on": _ratio(serverless, always),
    }


def check_rate(rate: float) -> float:
    """A host-loss rate per pod-hour: a finite number in 0..10."""
    if not (math.isfinite(rate) and 0 <= rate <= 10):
        raise ValueError(f"community hosts lost per pod-hour: 0..10, not {rate}")
    return rate


def night(
    seed: int = SEED, host_lost_per_pod_h: float = HOST_LOST_PER_POD_H, prices: Prices | None = None
) -> dict[str, Any]:
    """The four plans over the same seeded night, and their cost ratios; ``prices``:
    RunPod's catalog (read through the provider when not given)."""
    rate = check_rate(host_lost_per_pod_h)
    seen = dict(prices) if prices is not None else read_catalog()
    jobs = night_jobs(seed)
    community = Plan(PLANS[0], plan_tier("community-batch", "COMMUNITY"), "COMMUNITY", rate)
    secure = Plan(PLANS[1], plan_tier("secure-batch", "SECURE"), "SECURE")
    serverless = Plan(PLANS[2], plan_tier("serverless", "SECURE"), "SERVERLESS")
    runs = {p.name: run_plan(p, jobs, seen, seed) for p in (community, secure, serverless)}
    pool = max(1, runs[PLANS[1]]["peak_pods"])
    always = Plan(PLANS[3], plan_tier("always-on", "SECURE", pool), "SECURE")
    runs[PLANS[3]] = run_plan(always, jobs, seen, seed)
    return {
        "jobs": [_job_row(j) for j in jobs],
        "plans": {key: runs[key] for key in PLANS},
        "always_on_workers": pool,
        "ratios": _ratios(runs),
        "prices_usd_per_gpu_hr": {
            g: {"secure": p.secure, "community": p.community, "serverless": p.serverless}
            for g, p in sorted(seen.items())
        },
        "parameters": {
            "seed": seed,
            "host_lost_per_pod_h": rate,
            "tick_s": TICK_S,
            "startup_s": STARTUP_S,
            "serverless_start_s": SERVERLESS_START_S,
            "idle_timeout_s": IDLE_TIMEOUT_S,
            "checkpoint_s": CHECKPOINT_S,
            "max_workers": MAX_WORKERS,
            "max_parallel": MAX_PARALLEL,
            "segment_s": SEGMENT_S,
            "night": "20:00-08:00 Europe/Paris",
        },
    }


def _job_row(job: NightJob) -> dict[str, Any]:
    return {
        "id": job.id,
        "model": job.spec.model,
        "fps": job.spec.fps,
        "segments": len(job.spec.inputs),
        "frames": job.frames_per_task * len(job.spec.inputs),
        "submitted": _local(START.timestamp() + job.submitted_s),
    }


LABELS = {
    "community_scale_to_zero": "community pods from 0 (framerelay)",
    "secure_scale_to_zero": "secure pods from 0",
    "serverless": "serverless endpoint",
    "always_on_secure": "always-on secure pool",
}
COLORS = {
    "community_scale_to_zero": "tab:green",
    "secure_scale_to_zero": "tab:orange",
    "serverless": "tab:blue",
    "always_on_secure": "tab:red",
}


def report(out: dict[str, Any]) -> None:
    jobs, p = out["jobs"], out["parameters"]
    frames = sum(j["frames"] for j in jobs)
    hours = sum(j["segments"] for j in jobs) * p["segment_s"] / 3600
    print(
        f"a night of jobs: {len(jobs)} jobs, {hours:.0f} h of recordings, {frames:,} frames, "
        f"submitted {jobs[0]['submitted']}-{jobs[-1]['submitted']}; seed {p['seed']}, "
        f"{p['host_lost_per_pod_h']} community hosts lost per pod-hour, pods warm in "
        f"{p['startup_s']:.0f} s, serverless workers in {p['serverless_start_s']:.0f} s"
    )
    print(
        f"  {'plan':38s} {'$/GPU-h':>7s} {'cost':>8s} {'GPU-h':>6s} {'exec-h':>6s} "
        f"{'peak':>4s} {'hosts lost':>10s} {'redone':>7s} {'frames done':>11s} {'last done':>9s}"
    )
    for key, row in out["plans"].items():
        label = LABELS[key] + (f" x{out['always_on_workers']}" if key == "always_on_secure" else "")
        print(
            f"  {label:38s} {row['usd_per_gpu_hr']:7.2f} ${row['usd']:7.2f} "
            f"{row['gpu_hours']:6.1f} {row['execution_hours']:6.1f} {row['peak_pods']:4d} "
            f"{row['hosts_lost']:10d} {row['redone_frames']:7,d} {row['frames_processed']:11,d} "
            f"{row['last_job_done'] or '-':>9s}"
        )
    r = out["ratios"]
    serverless = out["plans"]["serverless"]
    print(
        f"  community / secure {r['community_vs_secure']:.3f}; community / always-on "
        f"{r['community_vs_always_on']:.3f}; serverless / community "
        f"{r['serverless_vs_community']:.3f}; serverless / secure {r['serverless_vs_secure']:.3f}"
    )
    print(
        f"  serverless billed ${serverless['usd']:.2f}, of which execution "
        f"${serverless['execution_usd']:.2f} (what RunPod's executionTime accounts); the rest "
        f"is {serverless['workers_started']} worker starts and idle timeouts"
    )


def plot(fig: Figure, out: dict[str, Any]) -> None:
    """Workers through the night per plan; the night's four bills."""
    pods, bills = fig.subplots(1, 2, width_ratios=(2, 1))
    for key, row in out["plans"].items():
        hours, counts = zip(*row["pods_over_time"], strict=True)
        style = "--" if key == "secure_scale_to_zero" else "-"
        pods.step(
            hours, counts, where="post", label=LABELS[key], color=COLORS[key], linestyle=style
        )
    pods.set(
        xlabel=f"hours after {START:%H:%M} (Europe/Paris)",
        ylabel="workers",
        title="the night's workers",
    )
    pods.set_ylim(0, out["always_on_workers"] * 1.5)
    pods.legend(loc="upper right")
    usd = [row["usd"] for row in out["plans"].values()]
    names = [LABELS[k].replace(" from", "\nfrom").replace(" (", "\n(") for k in out["plans"]]
    bars = bills.barh(names, usd, color=[COLORS[k] for k in out["plans"]])
    bills.bar_label(bars, fmt="$%.2f", padding=2)
    bills.set_xlim(0, max(usd) * 1.3)
    bills.set(xlabel="USD for the night", title="the night's bill")
