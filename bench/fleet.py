"""A simulated day of the fleet: schedule, 3 spot preemptions, cost vs on-demand.

Runs the real orchestrator logic (``deploy.fleet.Fleet``: schedule, scaling,
placement, reconcile, cost) against the RunPod contract server over real HTTP
and a real Redis, with a fake clock: a Monday (Europe/Paris) in seconds. Pods
run nothing, so health comes from the provider's status (``StatusProber``);
canaries and re-homing are covered by tests/faults.

Streams: 2 critical cameras all day; 16 standard cameras during opening hours
(07:00-19:00); 8 batch jobs that may only run in the night window
(20:00-06:00). 5 fps each. Spot pods are preempted at 10:00, 14:00, 22:00.

Baselines, same streams and same SLO (every stream placed whenever it may run,
at the same target utilisation, checked every step):
* ``spot``: this run - critical on on-demand, the rest on spot (cheaper),
  on-demand overflow, warm pools on the schedule;
* ``ondemand_always_on``: all on-demand with no orchestrator - the smallest
  static fleet of on-demand workers that carries every step's streams (packed
  by the scaler's own code), paid 24 h: what an operator without framerelay's
  schedules and spot runs;
* ``ondemand_same_schedule``: the same orchestrator and schedule with every
  tier on-demand: the spot lever alone.

The contract server's prices are illustrative (community spot 0.31x secure
on-demand); ``price_sensitivity`` re-prices the run's pod-hours at other spot /
on-demand ratios (published RunPod discounts span about 0.3-0.65x).

    python bench/fleet.py [--redis-url URL] [--step-minutes 10]

Then sizing by need (``bench/_fleet_sizing.py``): two models on two GPU types,
the ranking of the types with the reason for each, and the day's cost per
stream-hour on the chosen type against all on-demand and against one GPU type
chosen by price per hour alone.

Then a night of batch jobs (``bench/_fleet_jobs.py``, issue 18): 8 jobs of recordings
submitted 22:00-02:00 on a spot tier that scales from zero (seeded preemptions, work
since the last checkpoint redone), against the same jobs on on-demand scaled the same
way and against an always-on on-demand pool sized for the peak.

Prints the costs and savings; writes ``bench/results/fleet.json`` and
``fleet.png`` (pods per tier through the day, and the three bills).
``--night-only`` runs the night alone (no Redis, about a second) into
``fleet_night.json`` and ``fleet_night.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import math
import secrets
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from pydantic import SecretStr
from redis.asyncio import Redis

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._fleet_jobs import PREEMPT_PER_POD_H, SEED, night  # noqa: E402
from bench._fleet_jobs import plot as plot_night  # noqa: E402
from bench._fleet_jobs import report as report_night  # noqa: E402
from bench._fleet_sizing import report as report_sizing  # noqa: E402
from bench._fleet_sizing import sizing_day  # noqa: E402
from bench._progress import Progress  # noqa: E402
from bench._redis import add_redis_url, redis_for_bench  # noqa: E402
from bench._results import RESULTS, write_results  # noqa: E402
from bench.rig.runpod_contract import PRICES, ContractState, running_contract_server  # noqa: E402
from deploy.clock import FakeClock  # noqa: E402
from deploy.cost import CostTotals  # noqa: E402
from deploy.fleet import Fleet  # noqa: E402
from deploy.health import StatusProber  # noqa: E402
from deploy.ingest_link import NullIngestLink  # noqa: E402
from deploy.models import StreamSpec  # noqa: E402
from deploy.pod_trust import make_trust  # noqa: E402
from deploy.providers.runpod import RunPodProvider  # noqa: E402
from deploy.scaling import plan_workers  # noqa: E402
from deploy.settings import OrchestratorSettings, RunPodSettings, TierConfig, Window  # noqa: E402
from deploy.store import Store  # noqa: E402
from framerelay.auth.keys import KeySet, generate  # noqa: E402

TZ = "Europe/Paris"
CAPACITY = 20.0
STEP_S = 600.0
PREEMPT_AT = (dt.time(10, 0), dt.time(14, 0), dt.time(22, 0))
GPU = "NVIDIA RTX A4000"
OPEN = Window(start=dt.time(7, 0), end=dt.time(19, 0), min_warm=1)
NIGHT = Window(days=(0, 1, 2, 3, 4, 5, 6), start=dt.time(20, 0), end=dt.time(6, 0), min_warm=1)


def tiers(spot: bool) -> list[TierConfig]:
    cloud = ("COMMUNITY",) if spot else ("SECURE",)
    common: dict[str, Any] = {"gpu_types": (GPU,), "capacity_fps": CAPACITY, "lead_s": 900}
    return [
        TierConfig(name="critical", min_warm=1, max_workers=2, **common),
        TierConfig(name="spot", spot=spot, cloud_types=cloud, max_workers=6, windows=(OPEN,),
                   **common),
        TierConfig(name="overflow", max_workers=4, **common),
        TierConfig(name="batch", spot=spot, cloud_types=cloud, max_workers=4, windows=(NIGHT,),
                   batch_only=True, **common),
    ]  # fmt: skip


def streams(kind: str, n: int, priority: str) -> list[StreamSpec]:
    return [
        StreamSpec(id=f"{kind}-{i}", url=f"rtsp://cam/{kind}/{i}", priority=priority, fps=5)
        for i in range(n)
    ]


CRITICAL, STANDARD, BATCH = (
    streams("crit", 2, "critical"),
    streams("std", 16, "standard"),
    streams("job", 8, "batch"),
)


def _open(local: dt.datetime) -> bool:
    return local.weekday() < 5 and dt.time(7) <= local.time() < dt.time(19)


def _night(local: dt.datetime) -> bool:
    return local.time() >= dt.time(20) or local.time() < dt.time(6)


async def _sync_streams(store: Store, local: dt.datetime) -> None:
    """Standard cameras exist during opening hours only; the rest all day."""
    for s in CRITICAL + BATCH:
        await store.put_stream(s)
    for s in STANDARD:
        if _open(local):
            await store.put_stream(s)
        else:
            await store.del_stream(s.id)


def static_ondemand_workers(step_s: float = STEP_S) -> int:
    """The smallest static on-demand fleet that carries every step's runnable streams."""
    settings = OrchestratorSettings(
        tiers=[TierConfig(name="ondemand", max_workers=1000, capacity_fps=CAPACITY)]
    )
    start = dt.datetime(2026, 3, 2, 0, 0, tzinfo=ZoneInfo(TZ))
    most = 0
    for i in range(int(24 * 3600 / step_s)):
        local = start + dt.timedelta(seconds=i * step_s)
        running = CRITICAL + (STANDARD if _open(local) else []) + (BATCH if _night(local) else [])
        plan = plan_workers(settings, running, {"ondemand": CAPACITY}, {}, {"ondemand": 0})
        most = max(most, plan["ondemand"])
    return most


def _check_slo(
    fleet: Fleet, assign: dict[str, str], spot_pods: set[str], local: dt.datetime
) -> int:
    """Violations this step: a critical stream on spot raises; unplaced runnable streams count."""
    for s in CRITICAL:
        if assign.get(s.id) in spot_pods:
            raise AssertionError(f"critical stream {s.id} on spot at {local}")
    return sum(1 for sid in fleet.unplaced if not sid.startswith("job-") or _night(local))


async def simulate(
    spot: bool, redis_url: str, *, step_s: float = STEP_S, bar: Progress | None = None
) -> dict[str, Any]:
    tz = ZoneInfo(TZ)
    start = dt.datetime(2026, 3, 2, 0, 0, tzinfo=tz)  # a Monday
    clock = FakeClock(start)
    key = "sim-" + secrets.token_hex(8)
    state = ContractState(key, clock=clock.now)
    keys = KeySet([generate("EdDSA")])  # pods get its public half and their own certificate
    ca_dir = tempfile.TemporaryDirectory(prefix="bench-fleet-ca-")
    settings = OrchestratorSettings(
        provider="runpod", tiers=tiers(spot), timezone=TZ, key_prefix=f"bench-fleet-{key}:",
        signing_keys=SecretStr(keys.to_json()), ca_dir=Path(ca_dir.name) / "ca", tick_s=step_s,
        startup_grace_s=3600,
    )  # fmt: skip
    redis = Redis.from_url(redis_url)
    store = Store(redis, settings.key_prefix)
    preempted, violations, peak = 0, 0, 0
    hourly: list[dict[str, int]] = []
    with ca_dir, running_contract_server(state) as base:
        provider = RunPodProvider(RunPodSettings(api_key=SecretStr(key), base_url=base))
        fleet = Fleet(settings, provider, store, StatusProber(CAPACITY), NullIngestLink(), clock,
                      trust=make_trust(settings, keys, provider))  # fmt: skip
        try:
            steps = int(24 * 3600 / step_s)
            for _ in range(steps + 1):
                local = dt.datetime.fromtimestamp(clock.now(), tz)
                await _sync_streams(store, local)
                if local.time() in PREEMPT_AT:
                    victims = [p for p in state.pods.values() if p["interruptible"]]
                    if victims:
                        state.preempt(victims[0]["id"])
                        preempted += 1
                await fleet.tick()  # one pass: sees the preemption, re-homes
                await fleet.tick()  # the next pass at the same instant: places on new pods
                pods = await store.pods()
                spot_pods = {n for n, p in pods.items() if p.spot}
                violations += _check_slo(fleet, await store.assignments(), spot_pods, local)
                peak = max(peak, len(pods))
                if local.minute == 0 and len(hourly) < 24:
                    hourly.append(dict(collections.Counter(p.tier for p in pods.values())))
                clock.advance(step_s)
                if bar is not None:
                    bar.advance()
            cost = CostTotals.from_flat(await store.cost())
            events = dict(fleet.counters)
        finally:
            await store.clear()
            await provider.aclose()
            await redis.aclose()
    return {"cost": cost.as_dict(), "fleet_usd": cost.fleet_usd, "preemptions": preempted,
            "unplaced_stream_steps": violations, "peak_pods": peak, "events": events,
            "pods_by_hour": hourly}  # fmt: skip


def _saving(cost: float, base: float) -> float:
    return round(1 - cost / base, 4) if base > 0 else 0.0


def price_sensitivity(cost: dict[str, Any], always_on_pod_h: float) -> list[dict[str, float]]:
    """Savings with the run's pod-hours re-priced at other spot / on-demand ratios."""
    ondemand_h = cost["pod_hours"] - cost["spot_pod_hours"]
    out = []
    for ratio in (PRICES[GPU][3] / PRICES[GPU][0], 0.45, 0.57, 0.65):
        paid = ondemand_h + cost["spot_pod_hours"] * ratio  # in on-demand pod-hours
        out.append({
            "spot_ratio": round(ratio, 3),
            "saving_vs_ondemand_always_on": _saving(paid, always_on_pod_h),
            "saving_vs_ondemand_same_schedule": _saving(paid, cost["pod_hours"]),
        })  # fmt: skip
    return out


async def run_day(
    redis_url: str, step_s: float = STEP_S, bar: Progress | None = None
) -> dict[str, Any]:
    with_spot = await simulate(True, redis_url, step_s=step_s, bar=bar)
    on_demand = await simulate(False, redis_url, step_s=step_s, bar=bar)
    static = static_ondemand_workers(step_s)
    always_on = static * PRICES[GPU][0] * 24
    return {
        "spot": with_spot,
        "ondemand_same_schedule": on_demand,
        "ondemand_always_on_workers": static,
        "ondemand_always_on_usd": round(always_on, 4),
        "saving_vs_ondemand_always_on": _saving(with_spot["fleet_usd"], always_on),
        "saving_vs_ondemand_same_schedule": _saving(with_spot["fleet_usd"], on_demand["fleet_usd"]),
        "price_sensitivity": price_sensitivity(with_spot["cost"], static * 24.0),
        "step_s": step_s,
        "prices_usd_per_gpu_hr": {"secure": PRICES[GPU][0], "community_spot": PRICES[GPU][3]},
        "sizing": sizing_day(step_s),
    }


def _rate(text: str) -> float:
    """Spot preemptions per pod-hour: a finite number in 0..10."""
    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if not (math.isfinite(rate) and 0 <= rate <= 10):
        raise argparse.ArgumentTypeError(f"a number of preemptions per pod-hour in 0..10, not "
                                         f"{text[:40]!r}")  # fmt: skip
    return rate


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_redis_url(ap)
    ap.add_argument("--step-minutes", type=int, default=int(STEP_S / 60),
                    choices=(5, 10, 15, 30, 60), help="the simulated clock's step")  # fmt: skip
    ap.add_argument("--night-only", action="store_true",
                    help="only the night of batch jobs (no Redis): fleet_night.json")  # fmt: skip
    ap.add_argument("--seed", type=int, default=SEED,
                    help="draws the night's jobs and its spot preemptions")  # fmt: skip
    ap.add_argument("--preempt-per-pod-hour", type=_rate, default=PREEMPT_PER_POD_H,
                    help="the night's spot preemption rate (0..10)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=RESULTS, help="the results' folder")
    args = ap.parse_args()
    jobs = night(args.seed, args.preempt_per_pod_hour)
    if args.night_only:
        report_night(jobs)
        write_results("fleet_night", jobs, plot_night, folder=args.out)
        return 0
    step_s = args.step_minutes * 60
    steps = 2 * (int(24 * 3600 / step_s) + 1)  # the spot run, then the on-demand one
    with redis_for_bench(args.redis_url, "fleet") as url, Progress(steps, "fleet", "steps") as bar:
        out = asyncio.run(run_day(url, step_s, bar))
    out["night_jobs"] = jobs
    report(out)
    write_results("fleet", out, plot, folder=args.out)
    return 0


def report(out: dict[str, Any]) -> None:
    spot, same = out["spot"], out["ondemand_same_schedule"]
    print(f"a simulated day, {out['step_s'] / 60:.0f}-minute steps, "
          f"{spot['preemptions']} spot preemptions, peak {spot['peak_pods']} pods, "
          f"{spot['unplaced_stream_steps']} stream-steps unplaced")  # fmt: skip
    print(
        f"  framerelay (spot where allowed)     ${spot['fleet_usd']:8.2f}  "
        f"({spot['cost']['pod_hours']:.1f} pod-h, {spot['cost']['spot_pod_hours']:.1f} on spot)"
    )
    print(f"  same schedule, all on-demand        ${same['fleet_usd']:8.2f}")
    print(f"  static all-on-demand, {out['ondemand_always_on_workers']} workers x 24 h "
          f"${out['ondemand_always_on_usd']:8.2f}")  # fmt: skip
    print("  spot/on-demand  saving vs static  saving vs same schedule")
    for row in out["price_sensitivity"]:
        print(f"  {row['spot_ratio']:14.2f}  {100 * row['saving_vs_ondemand_always_on']:15.1f} %"
              f"  {100 * row['saving_vs_ondemand_same_schedule']:22.1f} %")  # fmt: skip
    report_sizing(out["sizing"])
    if "night_jobs" in out:
        report_night(out["night_jobs"])


def plot(fig: Figure, out: dict[str, Any]) -> None:
    """Pods per tier at each hour of the spot run; the day's three bills."""
    pods, bills = fig.subplots(1, 2, width_ratios=(2, 1))
    hours = out["spot"]["pods_by_hour"]
    bottom = [0] * len(hours)
    for tier in sorted({t for h in hours for t in h}):
        counts = [h.get(tier, 0) for h in hours]
        pods.bar(range(len(hours)), counts, bottom=bottom, label=tier)
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    pods.set(xlabel="hour of the day (Europe/Paris)", ylabel="pods",
             title="framerelay's fleet through the day")  # fmt: skip
    pods.set_ylim(0, max(bottom, default=1) * 1.3)
    pods.legend(title="tier", ncols=4, loc="upper center")
    names = ("static\non-demand", "on-demand,\nsame schedule", "framerelay")
    usd = (out["ondemand_always_on_usd"], out["ondemand_same_schedule"]["fleet_usd"],
           out["spot"]["fleet_usd"])  # fmt: skip
    bars = bills.barh(names, usd, color=("tab:red", "tab:orange", "tab:green"))
    bills.bar_label(bars, fmt="$%.2f", padding=2)
    bills.set_xlim(0, max(usd) * 1.3)
    bills.set(xlabel="USD for the day", title="the day's bill")


if __name__ == "__main__":
    raise SystemExit(main())
