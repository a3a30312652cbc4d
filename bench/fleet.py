"""A simulated day of the fleet on RunPod as it is: secure + community against all secure.

Runs the real orchestrator logic (``deploy.fleet.Fleet``: schedule, scaling, placement,
reconcile, cost) and the real RunPod provider against the RunPod v2 contract server
(``bench/rig/runpod_v2_contract.py``, every request and answer checked against
RunPod's published schema) over real HTTP and a real Redis, with a fake clock: a
Monday (Europe/Paris) in 10-minute steps. Pods run nothing, so health comes from the
provider's status (``StatusProber``); canaries and re-homing are covered by tests/faults.

RunPod has no spot or interruptible pods (dropped in May 2026). Its cheaper capacity is
the **community cloud** (third parties' hosts: less reliable) and **serverless**
endpoints (workers from zero, billed per second). Every price here is read from RunPod's
catalog (``GET /v2/catalog/gpus``: secure, community and serverless $ per GPU-hour)
through the provider; the contract server's prices are illustrative, shaped as
RunPod's.

Cameras, 5 fps each: 2 critical all day; 16 standard during opening hours
(07:00-19:00); 8 batch streams (recordings) that may only run in the night window
(20:00-06:00). A camera-hour is an hour of one camera's video analysed, live or
recorded: 320 in the day.

* ``framerelay``: critical cameras on a secure tier (one pod warm all day), standard
  ones on a community tier in opening hours, a secure overflow tier, batch on a
  community tier at night. A community host is lost at 10:00, 14:00 and 22:00 (the
  contract server's ``vanish``: the pod is gone; the fleet's ``vanished`` event, its
  streams re-homed, the pod replaced);
* ``all_secure_same_schedule``: the same orchestrator and schedule with every tier on
  the secure cloud: the community lever alone;
* ``static_all_secure``: no orchestrator - the smallest static fleet of secure pods that
  carries every step's streams (packed by the scaler's own code), paid 24 h;
* ``framerelay_batch_serverless``: framerelay's day with the batch streams on a
  serverless endpoint instead of community pods: their frames' execution seconds (a
  worker at its full ``capacity_fps``) plus each worker's start and idle timeout, at
  the catalog's serverless price.

Printed and written: each plan's cost for the day and per camera-hour, its saving
against both all-secure baselines, and ``price_sensitivity``: the framerelay day's
community pod-hours re-priced at the community/secure ratios of the catalog's other GPU
types, and at a few what-if ratios, each as a catalog entry (secure, community).
Where the critical cameras actually ran is counted (``critical_on_community_steps``):
placement keeps critical streams off interruptible tiers only, and a community tier
is not one.

    python bench/fleet.py [--redis-url URL] [--step-minutes 10]

Then sizing by need (``bench/_fleet_sizing.py``): two models on two GPU types, the
ranking of the types with the reason for each, and the day's cost per stream-hour on
the chosen type against all secure and against one GPU type chosen by price per hour.

Then a night of batch jobs (``bench/_fleet_jobs.py``): 8 jobs of recordings submitted
22:00-02:00 on community pods from zero (hosts lost at a seeded rate, work since the
last checkpoint redone), against secure pods from zero, a serverless endpoint and an
always-on secure pool.

Prints the costs and savings; writes ``bench/results/fleet.json`` and ``fleet.png``
(pods per tier through the day, and the bills). ``--night-only`` runs the night alone
(no Redis, a few seconds) into ``fleet_night.json`` and ``fleet_night.png``.
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from pydantic import SecretStr
from redis.asyncio import Redis

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._fleet_catalog import catalog_prices, read_catalog  # noqa: E402
from bench._fleet_jobs import (  # noqa: E402
    HOST_LOST_PER_POD_H,
    IDLE_TIMEOUT_S,
    SEED,
    SERVERLESS_START_S,
    check_rate,
    night,
)
from bench._fleet_jobs import plot as plot_night  # noqa: E402
from bench._fleet_jobs import report as report_night  # noqa: E402
from bench._fleet_sizing import report as report_sizing  # noqa: E402
from bench._fleet_sizing import sizing_day  # noqa: E402
from bench._progress import Progress  # noqa: E402
from bench._redis import add_redis_url, redis_for_bench  # noqa: E402
from bench._results import RESULTS, write_results  # noqa: E402
from bench.rig.runpod_v2_contract import ContractServer, running_runpod_v2  # noqa: E402
from deploy.clock import FakeClock  # noqa: E402
from deploy.cost import CostTotals  # noqa: E402
from deploy.fleet import Fleet  # noqa: E402
from deploy.health import StatusProber  # noqa: E402
from deploy.ingest_link import NullIngestLink  # noqa: E402
from deploy.models import StreamSpec  # noqa: E402
from deploy.pod_trust import make_trust  # noqa: E402
from deploy.providers.base import GpuPrice  # noqa: E402
from deploy.providers.runpod.provider import RunPodProvider  # noqa: E402
from deploy.scaling import plan_workers  # noqa: E402
from deploy.settings import OrchestratorSettings, RunPodSettings, TierConfig, Window  # noqa: E402
from deploy.store import Store  # noqa: E402
from framerelay.auth.keys import KeySet, generate  # noqa: E402

TZ = "Europe/Paris"
CAPACITY = 20.0
STEP_S = 600.0
HOST_LOST_AT = (dt.time(10, 0), dt.time(14, 0), dt.time(22, 0))
GPU = "NVIDIA RTX A4000"
OPEN = Window(start=dt.time(7, 0), end=dt.time(19, 0), min_warm=1)
NIGHT = Window(days=(0, 1, 2, 3, 4, 5, 6), start=dt.time(20, 0), end=dt.time(6, 0), min_warm=1)
DAY = dt.datetime(2026, 3, 2, 0, 0, tzinfo=ZoneInfo(TZ))  # a Monday
CHEAP_TIERS = ("standard", "batch")
"""The tiers on the community cloud in framerelay's plan (on secure in the baseline)."""
WHAT_IF_RATIOS = (0.5, 0.8, 0.9)
"""Community/secure ratios no GPU type of the catalog has, re-priced as catalog entries."""


def tiers(community: bool) -> list[TierConfig]:
    """Critical and overflow on secure; standard and batch on community (or secure)."""
    cheap = ("COMMUNITY",) if community else ("SECURE",)
    common: dict[str, Any] = {"gpu_types": (GPU,), "capacity_fps": CAPACITY, "lead_s": 900}
    return [
        TierConfig(name="critical", min_warm=1, max_workers=2, **common),
        TierConfig(name="standard", cloud_types=cheap, max_workers=6, windows=(OPEN,), **common),
        TierConfig(name="overflow", max_workers=4, **common),
        TierConfig(
            name="batch",
            cloud_types=cheap,
            max_workers=4,
            windows=(NIGHT,),
            batch_only=True,
            **common,
        ),
    ]


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


def runnable(local: dt.datetime) -> list[StreamSpec]:
    """The streams that may run at ``local``: every plan must place all of them."""
    return CRITICAL + (STANDARD if _open(local) else []) + (BATCH if _night(local) else [])


def _steps(step_s: float) -> list[dt.datetime]:
    return [DAY + dt.timedelta(seconds=i * step_s) for i in range(int(24 * 3600 / step_s))]


def camera_hours(step_s: float = STEP_S) -> float:
    """Hours of camera video the day analyses (every runnable stream at every step)."""
    return sum(len(runnable(local)) for local in _steps(step_s)) * step_s / 3600


def batch_frames(step_s: float = STEP_S) -> float:
    """Frames of the batch streams in their window."""
    return sum(sum(s.fps for s in BATCH) for local in _steps(step_s) if _night(local)) * step_s


async def _sync_streams(store: Store, local: dt.datetime) -> None:
    """Standard cameras exist during opening hours only; the rest all day."""
    for s in CRITICAL + BATCH:
        await store.put_stream(s)
    for s in STANDARD:
        if _open(local):
            await store.put_stream(s)
        else:
            await store.del_stream(s.id)


def static_secure_workers(step_s: float = STEP_S) -> int:
    """The smallest static secure fleet that carries every step's runnable streams."""
    settings = OrchestratorSettings(
        tiers=[TierConfig(name="secure", max_workers=1000, capacity_fps=CAPACITY)]
    )
    most = 0
    for local in _steps(step_s):
        plan = plan_workers(settings, runnable(local), {"secure": CAPACITY}, {}, {"secure": 0})
        most = max(most, plan["secure"])
    return most


@dataclass(slots=True)
class _Day:
    """What one run counts as it goes."""

    hosts_lost: int = 0
    unplaced: int = 0
    critical_on_community: int = 0
    peak: int = 0
    hourly: list[dict[str, int]] = field(default_factory=list)


def _lose_a_community_host(server: ContractServer) -> bool:
    """The first running community pod's host is lost (the pod vanishes); False: none."""
    pods = sorted(server.pods.values(), key=lambda p: p.name)
    victims = [p for p in pods if p.cloud == "COMMUNITY" and p.status == "RUNNING"]
    if victims:
        server.vanish(victims[0].id)
    return bool(victims)


async def _step(
    fleet: Fleet, server: ContractServer, store: Store, day: _Day, local: dt.datetime
) -> None:
    """One step of the day: streams, a host lost at its instants, two passes, the checks."""
    await _sync_streams(store, local)
    if local.time() in HOST_LOST_AT and _lose_a_community_host(server):
        day.hosts_lost += 1
    await fleet.tick()  # one pass: sees the lost pod, re-homes
    await fleet.tick()  # the next pass at the same instant: places on new pods
    pods = await store.pods()
    community = {t.name for t in fleet.settings.tiers if "COMMUNITY" in t.cloud_types}
    on_community = {n for n, p in pods.items() if p.tier in community}
    assign = await store.assignments()
    day.critical_on_community += sum(1 for s in CRITICAL if assign.get(s.id) in on_community)
    day.unplaced += sum(1 for sid in fleet.unplaced if not sid.startswith("job-") or _night(local))
    day.peak = max(day.peak, len(pods))
    if local.minute == 0 and len(day.hourly) < 24:
        day.hourly.append(dict(collections.Counter(p.tier for p in pods.values())))


def _settings(
    community: bool, key: str, keys: KeySet, ca: Path, step_s: float
) -> OrchestratorSettings:
    return OrchestratorSettings(
        provider="runpod",
        tiers=tiers(community),
        timezone=TZ,
        key_prefix=f"bench-fleet-{key}:",
        signing_keys=SecretStr(keys.to_json()),
        ca_dir=ca,
        tick_s=step_s,
        startup_grace_s=3600,
    )


async def simulate(
    community: bool, redis_url: str, *, step_s: float = STEP_S, bar: Progress | None = None
) -> dict[str, Any]:
    """The day through the real fleet and provider on the contract server; ``community``:
    framerelay's plan (community hosts lost at :data:`HOST_LOST_AT`), else all secure."""
    clock = FakeClock(DAY)
    key = "sim-" + secrets.token_hex(8)
    server = ContractServer(key, clock=clock.now)
    keys = KeySet([generate("EdDSA")])  # pods get its public half and their own certificate
    day = _Day()
    with tempfile.TemporaryDirectory(prefix="bench-fleet-ca-") as ca:
        settings = _settings(community, key, keys, Path(ca) / "ca", step_s)
        redis = Redis.from_url(redis_url)
        store = Store(redis, settings.key_prefix)
        with running_runpod_v2(server) as base:
            runpod = RunPodSettings(api_key=SecretStr(key), base_url=base)
            provider = RunPodProvider(runpod, clock=clock.now)
            trust = make_trust(settings, keys, provider)
            fleet = Fleet(
                settings,
                provider,
                store,
                StatusProber(CAPACITY),
                NullIngestLink(),
                clock,
                trust=trust,
            )
            try:
                prices = await catalog_prices(provider)
                for _ in range(int(24 * 3600 / step_s) + 1):
                    local = dt.datetime.fromtimestamp(clock.now(), ZoneInfo(TZ))
                    await _step(fleet, server, store, day, local)
                    clock.advance(step_s)
                    if bar is not None:
                        bar.advance()
                cost = CostTotals.from_flat(await store.cost())
            finally:
                await store.clear()
                await provider.aclose()
                await redis.aclose()
    problems = server.violations + server.client_errors
    if problems:
        raise RuntimeError(f"the day broke RunPod's schema: {problems[:5]}")
    return _run_result(community, cost, day, dict(fleet.counters), prices)


def _run_result(
    community: bool,
    cost: CostTotals,
    day: _Day,
    events: dict[str, int],
    prices: Mapping[str, GpuPrice],
) -> dict[str, Any]:
    price = prices[GPU]
    cheap_usd = sum(cost.by_tier_usd.get(t, 0.0) for t in CHEAP_TIERS) if community else 0.0
    community_h = cheap_usd / price.community if price.community > 0 else 0.0
    return {
        "cost": cost.as_dict(),
        "fleet_usd": round(cost.fleet_usd, 4),
        "community_usd": round(cheap_usd, 4),
        "pod_hours_by_cloud": {
            "secure": round(cost.pod_seconds / 3600 - community_h, 3),
            "community": round(community_h, 3),
        },
        "hosts_lost": day.hosts_lost,
        "unplaced_stream_steps": day.unplaced,
        "critical_on_community_steps": day.critical_on_community,
        "peak_pods": day.peak,
        "events": events,
        "pods_by_hour": day.hourly,
        "catalog": as_table(prices),
    }


def as_table(prices: Mapping[str, GpuPrice]) -> dict[str, dict[str, float | None]]:
    """GPU type -> its secure, community and serverless $ per GPU-hour."""
    return {
        g: {"secure": p.secure, "community": p.community, "serverless": p.serverless}
        for g, p in sorted(prices.items())
    }


def _from_table(table: Mapping[str, Mapping[str, float | None]]) -> dict[str, GpuPrice]:
    return {
        g: GpuPrice(g, row["secure"] or 0.0, row["community"] or 0.0, serverless=row["serverless"])
        for g, row in table.items()
    }


def _saving(cost: float, base: float) -> float:
    return round(1 - cost / base, 4) if base > 0 else 0.0


def batch_on_serverless(price: GpuPrice, step_s: float = STEP_S) -> dict[str, float]:
    """The batch streams on a serverless endpoint: their frames at a worker's full
    :data:`CAPACITY` (execution), plus a start and an idle timeout per worker they keep
    busy, at the catalog's serverless price (scale to zero: nothing else billed)."""
    if price.serverless is None:
        raise RuntimeError(f"RunPod's catalog sells no serverless {price.gpu_type}")
    execution_s = batch_frames(step_s) / CAPACITY
    workers = math.ceil(sum(s.fps for s in BATCH) / CAPACITY)
    billed_s = execution_s + workers * (SERVERLESS_START_S + IDLE_TIMEOUT_S)
    return {
        "usd_per_gpu_hr": price.serverless,
        "execution_hours": round(execution_s / 3600, 3),
        "workers": workers,
        "billed_hours": round(billed_s / 3600, 3),
        "usd": round(billed_s * price.serverless / 3600, 4),
        "execution_usd": round(execution_s * price.serverless / 3600, 4),
    }


def _plan(usd: float, hours: float, same: float, static: float) -> dict[str, float]:
    return {
        "usd": round(usd, 4),
        "usd_per_camera_hour": round(usd / hours, 5),
        "saving_vs_all_secure_same_schedule": _saving(usd, same),
        "saving_vs_static_all_secure": _saving(usd, static),
    }


def price_sensitivity(
    run: dict[str, Any], prices: Mapping[str, GpuPrice], hours: float, same: float, static: float
) -> list[dict[str, Any]]:
    """framerelay's day with its community pod-hours re-priced: at each catalog GPU type's
    community/secure ratio, then at :data:`WHAT_IF_RATIOS`, each as a catalog entry of
    :data:`GPU`'s secure price (the same pods: the tiers' clouds are fixed by settings)."""
    secure = prices[GPU].secure
    secure_usd = run["fleet_usd"] - run["community_usd"]
    shapes = [(f"catalog: {g}", p.community / p.secure) for g, p in sorted(prices.items())]
    shapes += [("what-if", r) for r in WHAT_IF_RATIOS]
    out = []
    for source, ratio in sorted(shapes, key=lambda s: s[1]):
        entry = GpuPrice(GPU, secure, round(ratio * secure, 4))
        usd = secure_usd + run["pod_hours_by_cloud"]["community"] * entry.price("COMMUNITY", False)
        row = {"source": source, "community_over_secure": round(ratio, 3)}
        out.append({**row, **_plan(usd, hours, same, static)})
    return out


async def run_day(
    redis_url: str,
    step_s: float = STEP_S,
    bar: Progress | None = None,
    prices: Mapping[str, GpuPrice] | None = None,
) -> dict[str, Any]:
    framerelay = await simulate(True, redis_url, step_s=step_s, bar=bar)
    secure = await simulate(False, redis_url, step_s=step_s, bar=bar)
    seen = _from_table(framerelay["catalog"])  # read by the fleet's provider
    if prices is not None and as_table(prices) != framerelay["catalog"]:
        raise RuntimeError("the catalog the fleet read differs from the one given")
    price = seen[GPU]
    hours = camera_hours(step_s)
    static = static_secure_workers(step_s)
    same, static_usd = secure["fleet_usd"], static * price.secure * 24
    serverless = batch_on_serverless(price, step_s)
    batch_pods = framerelay["cost"]["by_tier_usd"].get("batch", 0.0)
    totals = {
        "framerelay": framerelay["fleet_usd"],
        "framerelay_batch_serverless": framerelay["fleet_usd"] - batch_pods + serverless["usd"],
        "all_secure_same_schedule": same,
        "static_all_secure": static_usd,
    }
    return {
        "camera_hours": round(hours, 3),
        "plans": {k: _plan(usd, hours, same, static_usd) for k, usd in totals.items()},
        "framerelay": framerelay,
        "all_secure_same_schedule": secure,
        "static_all_secure_workers": static,
        "batch": {
            "community_pods_usd": round(batch_pods, 4),
            "secure_pods_usd": round(secure["cost"]["by_tier_usd"].get("batch", 0.0), 4),
            "serverless": serverless,
        },
        "price_sensitivity": price_sensitivity(framerelay, seen, hours, same, static_usd),
        "step_s": step_s,
        "gpu_type": GPU,
        "prices_usd_per_gpu_hr": as_table(seen),
        "sizing": sizing_day(step_s, seen),
    }


def _rate(text: str) -> float:
    """Community hosts lost per pod-hour: a finite number in 0..10."""
    try:
        return check_rate(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a number of community hosts lost per pod-hour in 0..10, not {text[:40]!r}"
        ) from None


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_redis_url(ap)
    ap.add_argument(
        "--step-minutes",
        type=int,
        default=int(STEP_S / 60),
        choices=(5, 10, 15, 30, 60),
        help="the simulated clock's step",
    )
    ap.add_argument(
        "--night-only",
        action="store_true",
        help="only the night of batch jobs (no Redis): fleet_night.json",
    )
    ap.add_argument(
        "--seed", type=int, default=SEED, help="draws the night's jobs and its lost hosts"
    )
    ap.add_argument(
        "--host-lost-per-pod-hour",
        type=_rate,
        default=HOST_LOST_PER_POD_H,
        help="how often the night's community hosts are lost (0..10 per pod-hour)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS, help="the results' folder")
    return ap.parse_args()


def main() -> int:
    args = _args()
    prices = read_catalog()
    jobs = night(args.seed, args.host_lost_per_pod_hour, prices)
    if args.night_only:
        report_night(jobs)
        write_results("fleet_night", jobs, plot_night, folder=args.out)
        return 0
    step_s = args.step_minutes * 60
    steps = 2 * (int(24 * 3600 / step_s) + 1)  # framerelay's run, then the all-secure one
    with redis_for_bench(args.redis_url, "fleet") as url, Progress(steps, "fleet", "steps") as bar:
        out = asyncio.run(run_day(url, step_s, bar, prices))
    out["night_jobs"] = jobs
    report(out)
    write_results("fleet", out, plot, folder=args.out)
    return 0


LABELS = {
    "framerelay": "framerelay: secure + community",
    "framerelay_batch_serverless": "framerelay, batch on serverless",
    "all_secure_same_schedule": "all secure, same schedule",
    "static_all_secure": "static all secure, always on",
}


def report(out: dict[str, Any]) -> None:
    run, price = out["framerelay"], out["prices_usd_per_gpu_hr"][out["gpu_type"]]
    print(
        f"a simulated day on RunPod, {out['step_s'] / 60:.0f}-minute steps, {out['gpu_type']} "
        f"at ${price['secure']:.2f} secure / ${price['community']:.2f} community / "
        f"${price['serverless']:.2f} serverless per GPU-hour (the catalog's); "
        f"{run['hosts_lost']} community hosts lost, peak {run['peak_pods']} pods, "
        f"{run['unplaced_stream_steps']} stream-steps unplaced, "
        f"{run['critical_on_community_steps']} critical stream-steps on community pods"
    )
    print(
        f"  {'plan':33s} {'cost':>8s} {'per camera-h':>12s} "
        f"{'saving vs all secure same schedule':>34s} {'vs static':>9s}"
    )
    for key, row in out["plans"].items():
        print(
            f"  {LABELS[key]:33s} ${row['usd']:7.2f} ${row['usd_per_camera_hour']:11.4f} "
            f"{100 * row['saving_vs_all_secure_same_schedule']:32.1f} % "
            f"{100 * row['saving_vs_static_all_secure']:7.1f} %"
        )
    hours = run["pod_hours_by_cloud"]
    print(
        f"  framerelay: {hours['secure']:.1f} secure + {hours['community']:.1f} community "
        f"pod-h; static: {out['static_all_secure_workers']} secure pods x 24 h; "
        f"{out['camera_hours']:.0f} camera-hours"
    )
    _report_batch(out["batch"])
    print("  community/secure  saving vs same schedule  vs static  (catalog-shaped prices)")
    for row in out["price_sensitivity"]:
        print(
            f"  {row['community_over_secure']:16.3f}  "
            f"{100 * row['saving_vs_all_secure_same_schedule']:20.1f} %  "
            f"{100 * row['saving_vs_static_all_secure']:7.1f} %  {row['source']}"
        )
    report_sizing(out["sizing"])
    if "night_jobs" in out:
        report_night(out["night_jobs"])


def _report_batch(batch: dict[str, Any]) -> None:
    sls = batch["serverless"]
    ratio = sls["usd"] / batch["community_pods_usd"] if batch["community_pods_usd"] else math.inf
    print(
        f"  the night's batch streams: community pods ${batch['community_pods_usd']:.2f}, "
        f"secure pods ${batch['secure_pods_usd']:.2f}, serverless ${sls['usd']:.2f} "
        f"({sls['execution_hours']:.1f} h of execution, {sls['workers']} workers; "
        f"{ratio:.2f}x community pods)"
    )


def plot(fig: Figure, out: dict[str, Any]) -> None:
    """Pods per tier at each hour of framerelay's run; the day's bills."""
    pods, bills = fig.subplots(1, 2, width_ratios=(2, 1))
    hours = out["framerelay"]["pods_by_hour"]
    bottom = [0] * len(hours)
    for tier in sorted({t for h in hours for t in h}):
        counts = [h.get(tier, 0) for h in hours]
        pods.bar(range(len(hours)), counts, bottom=bottom, label=tier)
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    pods.set(
        xlabel="hour of the day (Europe/Paris)",
        ylabel="pods",
        title="framerelay's fleet through the day (standard, batch: community)",
    )
    pods.set_ylim(0, max(bottom, default=1) * 1.3)
    pods.legend(title="tier", ncols=4, loc="upper center")
    keys = list(reversed(LABELS))
    usd = [out["plans"][k]["usd"] for k in keys]
    names = [LABELS[k].replace(", ", ",\n").replace(": ", ":\n") for k in keys]
    colors = ("tab:red", "tab:orange", "tab:blue", "tab:green")
    bars = bills.barh(names, usd, color=colors)
    bills.bar_label(bars, fmt="$%.2f", padding=2)
    bills.set_xlim(0, max(usd) * 1.3)
    bills.set(xlabel="USD for the day", title="the day's bill")


if __name__ == "__main__":
    raise SystemExit(main())
