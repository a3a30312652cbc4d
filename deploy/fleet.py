"""The reconcile loop: desired vs actual pods, health, scaling, placement, cost.

``Fleet.tick()`` is one pass; the service calls it every ``tick_s`` and the
simulated day calls it with a fake clock. Each pass reads the state from Redis
and the provider, so the orchestrator may be killed and restarted at any
moment:

* Intent first: a pod's record (its name derived from tier, slot and
  generation) is written *before* the provider is asked to create it. On
  restart a record without a provider id is matched by name with the
  provider's pods (adopted) or created again under the same name: no
  duplicate. A pod of this fleet the records do not know is an orphan and is
  terminated; two pods with one name are a duplicate and one is terminated.
* A pod that vanished (spot preemption) or exited (process died) loses its
  streams at once; placement re-homes them on the next healthy worker. A pod the
  provider says will never serve (:attr:`PodStatus.ERROR`: RunPod's ERROR, or running
  with no public address past the provider's grace) is terminated and replaced at
  once, its reason in a ``failed`` event.
* A failed create is retried after ``create_backoff_s``, doubling per failure
  in a row. "No capacity anywhere allowed" (or a pod the provider says has no
  capacity, :attr:`PodStatus.NO_CAPACITY`: on Kubernetes, unschedulable past its
  grace; the pod is deleted) also holds the whole tier at the pods it has for
  that long, so the scaler sends its demand to the next allowed tier (spot
  gone: on-demand carries the standard streams until spot can be had again,
  then placement moves them back and the extra drains).
* A pod of ``gpu_count`` > 1 runs one worker per GPU (:mod:`deploy.workers`): each
  is probed, canaried and placed on its own; the pod goes when one of them fails.
* Placement is model-aware: the workers' models (their ``/info``, read by every probe)
  and the registry's memory needs decide where a stream's model can run; and latency-aware
  (:mod:`deploy.latency`): the ingest measures each ready worker's round trip.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo

from deploy.clock import Clock
from deploy.cost import PaidPod, accrue
from deploy.events import EventLog
from deploy.health import Probe, Prober
from deploy.ingest_link import IngestLink
from deploy.ingest_sync import IngestSync
from deploy.jobs import placement_view
from deploy.latency import Latency, annotate
from deploy.models import (
    PodInfo,
    PodRecord,
    PodSpec,
    PodStatus,
    WorkerState,
    parse_pod_name,
    pod_name,
)
from deploy.placement import Slot, place
from deploy.pod_trust import PodCredentials, PodTrust
from deploy.providers.base import GpuPrice, NoCapacityError, Provider, ProviderError
from deploy.scaling import tier_targets
from deploy.schedule import in_window
from deploy.settings import OrchestratorSettings, TierConfig
from deploy.sizing import rank, sizing_report, vram_need, why_chosen
from deploy.store import Store
from deploy.workers import (
    apply_probe,
    by_name,
    fleet_model_needs,
    move_reason,
    pod_load,
    pod_slots,
    pod_unhealthy,
    stream_load,
)
from framerelay.backoff import Backoff
from framerelay.model_registry import ModelRegistry, builtin_registry

log = logging.getLogger(__name__)


@dataclass
class Fleet:
    settings: OrchestratorSettings
    provider: Provider
    store: Store
    prober: Prober
    ingest: IngestLink
    clock: Clock
    worker_env: dict[str, str] = field(default_factory=dict)
    trust: PodTrust | None = None  # keys and certificates for new pods (None: simulations)
    registry: ModelRegistry = field(default_factory=builtin_registry)  # models' memory needs
    events: EventLog = field(default_factory=EventLog)
    latency: Latency = field(default_factory=Latency)  # round trips, budgets (issue 18)
    counters: collections.Counter[str] = field(default_factory=collections.Counter)
    prices: dict[str, GpuPrice] = field(default_factory=dict)
    targets: dict[str, int] = field(default_factory=dict)
    unplaced: list[str] = field(default_factory=list)
    blocked: dict[str, tuple[float, int]] = field(default_factory=dict)
    """tier -> (no create before this time, "no capacity" answers in a row)."""
    _sync: IngestSync = field(init=False)
    """What the ingest acknowledged of each stream (:mod:`deploy.ingest_sync`)."""

    def __post_init__(self) -> None:
        self._sync = IngestSync(self.ingest, self._redefined)

    def _redefined(self, worker: str, stream_id: str) -> None:
        self.event("redefined", worker, "its definition changed", stream_id)

    def held_until(self, tier: str) -> float:
        """No create for ``tier`` before this time ("no capacity" backoff); 0 = not held."""
        return self.blocked.get(tier, (0.0, 0))[0]

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.settings.timezone)

    def event(
        self, kind: str, pod: str, reason: str, stream: str | None = None, **detail: object
    ) -> None:
        """Count and log one fleet event (:mod:`deploy.events`)."""
        self.counters[kind] += 1
        self.events.record(self.clock.now(), kind, pod, reason, stream, **detail)
        log.info("fleet: %s %s %s (%s) %s", kind, pod, stream or "", reason, detail or "")

    async def tick(self) -> None:
        """One reconcile pass."""
        now = self.clock.now()
        self.prices.update(await self.provider.prices())
        pods = await self.store.pods()
        await self._account(pods, now)  # the interval since the last pass, as it was
        actual = await self._actual()
        await self._reconcile(pods, actual, now)
        await self._health(pods, actual, now)
        await self._scale(pods, now)
        await self._place(pods)

    # -- reconcile -------------------------------------------------------------

    async def _actual(self) -> dict[str, list[PodInfo]]:
        out: dict[str, list[PodInfo]] = {}
        for info in await self.provider.list():
            if parse_pod_name(self.settings.fleet, info.name) is not None:
                out.setdefault(info.name, []).append(info)
        return out

    async def _reconcile(
        self, pods: dict[str, PodRecord], actual: dict[str, list[PodInfo]], now: float
    ) -> None:
        for name, infos in actual.items():
            rec = pods.get(name)
            if rec is None:
                for info in infos:
                    await self._terminate(info.id, name, "orphan", "a pod of this fleet unknown")
                continue
            keep = next((i for i in infos if i.id == rec.provider_id), infos[0])
            for info in infos:
                if info is not keep:
                    await self._terminate(info.id, name, "duplicate", "a second pod of one name")
            actual[name] = [keep]
        for name, rec in list(pods.items()):
            found = actual.get(name)
            await self._reconcile_one(pods, rec, found[0] if found else None, now)

    async def _reconcile_one(
        self, pods: dict[str, PodRecord], rec: PodRecord, info: PodInfo | None, now: float
    ) -> None:
        if info is None:
            if rec.provider_id is None:
                if rec.retry_at is None or now >= rec.retry_at:
                    await self._create(pods, rec)  # an intent that never reached the provider
                return
            kind = "preempted" if rec.spot else "vanished"
            why = f"{'spot ' if rec.spot else ''}pod {rec.provider_id} gone from the provider"
            await self._lose(pods, rec, now, kind, why, count_failure=not rec.spot)
            return
        if info.status is PodStatus.ERROR:  # it will never serve: replace it now
            why = info.reason or "the provider says ERROR"
            await self._terminate(info.id, rec.name, "failed", why)
            await self._lose(pods, rec, now, "failed", why, count_failure=True)
            return
        if info.status is PodStatus.NO_CAPACITY:  # nowhere to run it: as a create refused
            why = info.reason or "the provider has no capacity for it"
            await self._terminate(info.id, rec.name, "no_capacity", why)
            await self._no_capacity(pods, rec, now, why)
            return
        if info.status in (PodStatus.EXITED, PodStatus.TERMINATED):
            kind = "preempted" if rec.spot and info.status is PodStatus.EXITED else "exited"
            why = f"the provider says {info.status.value}{' (spot)' if rec.spot else ''}"
            why += f": {info.reason}" if info.reason else ""
            await self._terminate(info.id, rec.name, kind, why)
            await self._lose(pods, rec, now, kind, why, count_failure=kind == "exited")
            return
        if rec.provider_id != info.id:
            self.event("adopted", rec.name, "found at the provider by its name", id=info.id)
        rec.provider_id = info.id
        rec.cost_per_hr, rec.gpu_type = info.cost_per_hr, info.gpu_type or rec.gpu_type
        rec.ondemand_per_hr = self._ondemand(rec)
        rec.set_endpoint(info)
        rec.provider_reason = info.reason
        if rec.state == "creating":
            rec.state = "running"
        await self.store.put_pod(rec)

    def _ondemand(self, rec: PodRecord) -> float:
        price = self.prices.get(rec.gpu_type)
        return max(price.ondemand if price else 0.0, rec.cost_per_hr)

    async def _lose(
        self,
        pods: dict[str, PodRecord],
        rec: PodRecord,
        now: float,
        kind: str,
        reason: str,
        *,
        count_failure: bool,
    ) -> None:
        """Forget a dead pod; its streams become unassigned (re-homed by placement)."""
        self.event(kind, rec.name, reason, tier=rec.tier, spot=rec.spot)
        if count_failure:
            await self.store.add_replacement(rec.tier, now, rec.name)
        await self.store.del_pod(rec.name)
        pods.pop(rec.name, None)

    async def _terminate(self, pod_id: str, name: str, why: str, reason: str) -> None:
        try:
            await self.provider.terminate(pod_id)
        except ProviderError as exc:
            log.warning("could not terminate %s (%s): %s", name, why, exc)
            return
        if why in ("orphan", "duplicate", "drained", "unhealthy"):
            self.event(f"terminated_{why}", name, reason, id=pod_id)

    # -- health ----------------------------------------------------------------

    async def _health(
        self, pods: dict[str, PodRecord], actual: dict[str, list[PodInfo]], now: float
    ) -> None:
        live = [
            r
            for r in pods.values()
            if actual.get(r.name) and actual[r.name][0].status is PodStatus.RUNNING
        ]
        checks = [(r, w) for r in live for w in r.workers() if w.tunnel_url and w.http_url]
        probes = await asyncio.gather(*(self._probe(w, now) for _, w in checks))
        for (_, worker), probe in zip(checks, probes, strict=True):
            self._apply_probe(worker, probe, now)
        await self.latency.measure((w for _, w in checks), now)
        for rec in {r.name: r for r, _ in checks}.values():
            rec.sum_up()
            await self.store.put_pod(rec)
        for rec in list(pods.values()):
            if self._unhealthy(rec, now):
                await self._replace(pods, rec, now)

    def _unhealthy(self, rec: PodRecord, now: float) -> bool:
        """Any worker of the pod failed for good, or never got ready in time."""
        after, grace = self.settings.unhealthy_after, self.settings.startup_grace_s
        return pod_unhealthy(rec, now, after, grace)

    async def _probe(self, worker: WorkerState, now: float) -> Probe:
        due = (
            not worker.ready
            or worker.last_canary is None
            or now - worker.last_canary >= self.settings.canary_interval_s
        )
        assert worker.tunnel_url is not None and worker.http_url is not None  # noqa: S101
        return await self.prober.probe(
            worker.name, worker.tunnel_url, worker.http_url, canary=due,
            tls_name=worker.tls_server_name,
        )  # fmt: skip

    def _apply_probe(self, worker: WorkerState, probe: Probe, now: float) -> None:
        change = apply_probe(worker, probe, now, self.settings.unhealthy_after)
        if change == "unhealthy":
            self.event("unhealthy", worker.name, worker.last_error or "failed",
                       error=worker.last_error, healthz_ok=probe.alive,
                       readyz_ok=probe.ready)  # fmt: skip
        elif change == "ready":
            self.event("ready", worker.name, "the canary inference passed",
                       canary_ms=round(probe.canary_ms, 1), persons=probe.persons)  # fmt: skip
        elif change is not None:
            self.counters[change] += 1

    async def _replace(self, pods: dict[str, PodRecord], rec: PodRecord, now: float) -> None:
        since = now - self.settings.replacement_window_s
        if await self.store.replacements_since(rec.tier, since) >= self.settings.max_replacements:
            if self.counters["budget_exhausted"] == 0 or rec.fails % 10 == 0:
                why = f"{self.settings.max_replacements} replacements in the window already"
                self.event("budget_exhausted", rec.name, why, tier=rec.tier)
            return
        why = rec.last_error or rec.provider_reason or "not ready within startup_grace_s"
        if rec.provider_id is not None:
            await self._terminate(rec.provider_id, rec.name, "unhealthy", why)
        await self._lose(pods, rec, now, "replaced", why, count_failure=True)

    # -- scaling ---------------------------------------------------------------

    async def _scale(self, pods: dict[str, PodRecord], now: float) -> None:
        stored = (await self.store.streams()).values()
        streams = placement_view(self.settings, stored, pods, self.prices)  # a job task: a worker
        limits = {
            tier: sum(r.tier == tier and r.provider_id is not None for r in pods.values())
            for tier in self.blocked
            if now < self.held_until(tier)
        }
        needs = fleet_model_needs(self.registry, pods.values())
        expected = self.latency.tier_expected(pods.values())  # budgets: tiers that meet them
        self.targets = tier_targets(
            self.settings, streams, pods, self.prices, now, limits, needs, expected
        )
        for name, floor in (await self.store.floors()).items():
            cfg = self.settings.tier(name)
            if cfg is not None and floor > 0 and cfg.rents_pods:
                self.targets[name] = min(cfg.max_workers, max(self.targets.get(name, 0), floor))
        for tier in self.settings.tiers:
            await self._scale_tier(tier, pods, now)

    async def _scale_tier(self, tier: TierConfig, pods: dict[str, PodRecord], now: float) -> None:
        mine = [r for r in pods.values() if r.tier == tier.name]
        active = [r for r in mine if r.state != "draining"]
        target = self.targets.get(tier.name, 0)
        draining = sorted((r for r in mine if r.state == "draining"), key=lambda r: r.name)
        while len(active) < target and draining:  # cheaper than a new pod: un-drain
            rec = draining.pop(0)
            rec.state, rec.draining_since = "running", None
            active.append(rec)
            await self.store.put_pod(rec)
        if len(active) < target:
            await self._grow(tier, pods, target - len(active), now)
        elif len(active) > target:
            await self._shrink(active, len(active) - target, now)
        await self._finish_drains(pods, draining, now)

    async def _grow(self, tier: TierConfig, pods: dict[str, PodRecord], n: int, now: float) -> None:
        if now < self.held_until(tier.name):
            self.counters["create_deferred"] += 1
            return
        since = now - self.settings.replacement_window_s
        if await self.store.replacements_since(tier.name, since) >= self.settings.max_replacements:
            self.counters["budget_blocked_create"] += 1
            return
        used = {r.slot for r in pods.values() if r.tier == tier.name}
        free = (s for s in range(tier.max_workers * 2 + 1) if s not in used)
        for slot in list(free)[:n]:
            gen = await self.store.next_gen(tier.name, slot)
            rec = PodRecord(
                name=pod_name(self.settings.fleet, tier.name, slot, gen),
                tier=tier.name,
                slot=slot,
                gen=gen,
                spot=tier.interruptible,
                created_at=now,
                gpu_count=tier.gpu_count,
            )
            rec.workers()  # one per GPU
            await self.store.put_pod(rec)  # intent first, then the provider
            pods[rec.name] = rec
            await self._create(pods, rec)

    async def _shrink(self, active: list[PodRecord], n: int, now: float) -> None:
        load = stream_load(await self.store.assignments())
        order = sorted(active, key=lambda r: (r.ready, pod_load(r, load), -r.slot))
        for rec in order[:n]:
            rec.state, rec.draining_since = "draining", now
            why = f"tier {rec.tier} needs {self.targets.get(rec.tier, 0)} workers"
            self.event("draining", rec.name, why, tier=rec.tier)
            await self.store.put_pod(rec)

    async def _finish_drains(
        self, pods: dict[str, PodRecord], draining: list[PodRecord], now: float
    ) -> None:
        if not draining:
            return
        load = stream_load(await self.store.assignments())
        for rec in draining:
            expired = now - (rec.draining_since or now) >= self.settings.drain_timeout_s
            if pod_load(rec, load) == 0 or expired:
                why = "drain timed out" if pod_load(rec, load) else "drained: no stream left"
                if rec.provider_id is not None:
                    await self._terminate(rec.provider_id, rec.name, "drained", why)
                await self.store.del_pod(rec.name)
                pods.pop(rec.name, None)

    def _spec(self, rec: PodRecord) -> PodSpec:
        tier = self.settings.tier(rec.tier)
        assert tier is not None  # noqa: S101 - records are made from tiers
        creds = self.trust.for_pod(rec.name) if self.trust else PodCredentials()
        env = {**self.worker_env, **creds.env, "FRAMERELAY_WORKER_WORKER_ID": rec.name}
        env.setdefault("FRAMERELAY_WORKER_HOST", "0.0.0.0")  # noqa: S104 - inside a pod
        fitting = [c for c in rank(self.settings, tier, self.prices) if c.fits]
        return PodSpec(
            name=rec.name, tier=tier.name, spot=tier.interruptible,
            gpu_types=tuple(c.gpu_type for c in fitting),
            cloud_types=tier.cloud_types, data_centers=tier.data_centers, env=env,
            secret_env=creds.secret_env, tls_server_name=creds.tls_server_name,
            gpu_count=tier.gpu_count, template_id=tier.template_id,
            min_vram_gb=vram_need(self.settings, tier),
            gpu_fps={c.gpu_type: c.capacity_fps for c in fitting if c.capacity_fps},
        )  # fmt: skip

    def _backoff(self, failures: int) -> float:
        """The wait after ``failures`` failed creates in a row (no jitter: ticks are coarse)."""
        base, most = self.settings.create_backoff_s, self.settings.create_backoff_max_s
        return Backoff(min(base, most), most, jitter=0.0).delay(failures - 1)

    async def _create(self, pods: dict[str, PodRecord], rec: PodRecord) -> None:
        now = self.clock.now()
        try:
            info = await self.provider.create(self._spec(rec))
        except NoCapacityError as exc:
            await self._no_capacity(pods, rec, now, str(exc))
            return
        except ProviderError as exc:  # the pod may exist: keep the intent, retry later
            rec.create_failures += 1
            wait = self._backoff(rec.create_failures)
            rec.retry_at, rec.last_error = now + wait, str(exc)[:500]
            await self.store.put_pod(rec)
            self.event("create_failed", rec.name, rec.last_error, error=rec.last_error,
                       retry_in_s=wait)  # fmt: skip
            return
        self.blocked.pop(rec.tier, None)
        rec.create_failures, rec.retry_at, rec.last_error = 0, None, None
        rec.provider_id, rec.state = info.id, "running"
        rec.cost_per_hr, rec.gpu_type = info.cost_per_hr, info.gpu_type
        rec.ondemand_per_hr = self._ondemand(rec)
        rec.set_endpoint(info)
        rec.provider_reason = info.reason
        await self.store.put_pod(rec)
        why = f"tier {rec.tier} needs {self.targets.get(rec.tier, 0)} workers"
        gpu_why = why_chosen(self.settings, rec.tier, rec.gpu_type, self.prices)
        self.event("created", rec.name, why, id=info.id, gpu=info.gpu_type,
                   usd_hr=info.cost_per_hr, tier=rec.tier, gpu_why=gpu_why)  # fmt: skip

    def sizing(self) -> dict[str, list[dict[str, object]]]:
        """Per tier, its GPU types in the order they are tried, each with the reason."""
        return sizing_report(self.settings, self.prices)

    async def _no_capacity(
        self, pods: dict[str, PodRecord], rec: PodRecord, now: float, reason: str
    ) -> None:
        """Every allowed option said "no capacity" (or the provider found no place for the pod
        it took: :attr:`PodStatus.NO_CAPACITY`, deleted by then), so no pod exists: drop the
        intent and hold the tier at what it has for a while (its demand goes to the next
        allowed tier)."""
        failures = self.blocked.get(rec.tier, (0.0, 0))[1] + 1
        wait = self._backoff(failures)
        self.blocked[rec.tier] = (now + wait, failures)
        error = reason[:500]
        self.event("no_capacity", rec.name, error, tier=rec.tier, error=error, retry_in_s=wait)
        await self.store.del_pod(rec.name)
        pods.pop(rec.name, None)

    # -- placement and cost ----------------------------------------------------

    def _slots(self, pods: dict[str, PodRecord]) -> list[Slot]:
        """Ready workers (one per GPU of a pod) with their models; a batch-only tier's take
        streams only inside its windows (its workers warm up ``lead_s`` early, but batch
        work starts when the window opens)."""
        now, slots = self.clock.now(), list[Slot]()
        for rec in pods.values():
            tier = self.settings.tier(rec.tier)
            if tier is None or rec.state != "running":
                continue
            if tier.batch_only and not in_window(tier, now, self.tz):
                continue
            default = self.settings.default_capacity_fps
            slots += pod_slots(rec, tier, default, self.settings.target_utilization)
        return slots

    async def _place(self, pods: dict[str, PodRecord]) -> None:
        streams = await self.store.streams()
        current = await self.store.assignments()
        pins = await self.store.pins()
        batch_pinned = any(t.batch_only and t.rents_pods for t in self.settings.tiers)
        slots = self._slots(pods)
        annotate(slots, pods, self.settings)  # round trips, regions, processing times
        result = place(
            placement_view(self.settings, streams.values(), pods, self.prices), slots, current,
            self.settings.model_costs,
            batch_pinned=batch_pinned, pins=pins,
            models=fleet_model_needs(self.registry, pods.values()),
            region_slack_ms=self.settings.region_slack_ms,
        )  # fmt: skip
        for kind, pod, why, sid, detail in self.latency.report(result.breaches):
            self.event(kind, pod, why, sid, **detail)
        self.unplaced = sorted(result.unplaced)
        ready = {s.name for s in self._slots(pods)}
        for sid, (old, new) in result.moves(current).items():
            await self.store.set_assignment(sid, new)
            if sid in streams:
                why = move_reason(old, new, ready, pins.get(sid))
                self.event("moved", new or "", why, sid, old=old, new=new)
        await self._sync.forget_gone(streams)
        workers = by_name(pods.values())
        for sid, spec in streams.items():
            await self._sync.tell(spec, result.assign.get(sid), workers)

    async def _account(self, pods: dict[str, PodRecord], now: float) -> None:
        last = await self.store.mark_accrual(now)
        if last is None or now <= last:
            return
        paid = [
            PaidPod(r.tier, r.spot, r.cost_per_hr, r.ondemand_per_hr or r.cost_per_hr)
            for r in pods.values()
            if r.provider_id is not None
        ]
        workers = by_name(pods.values())
        served = sum(1 for w in (await self.store.assignments()).values() if w in workers)
        await self.store.add_cost(accrue(paid, served, now - last))

    def burn_rate(self, pods: dict[str, PodRecord]) -> float:
        return sum(r.cost_per_hr for r in pods.values() if r.provider_id is not None)
