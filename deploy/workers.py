"""A pod's workers as the orchestrator sees them: health from probes, load, lookup.

A pod of one GPU is one worker (named as the pod); a pod of ``gpu_count`` > 1 runs
one worker per GPU (``<pod>-gpu<i>``), each with its own port, token scope
(``worker:<pod>-gpu<i>``) and health: each is probed and canaried on its own and
placement sees each GPU's capacity. A pod is replaced as a whole (the provider
rents pods, not GPUs) when any of its workers is unhealthy.

Pure functions on :class:`deploy.models.WorkerState`; the fleet applies them.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from typing import Literal

from deploy.health import Probe
from deploy.models import PodRecord, WorkerState
from deploy.placement import ModelNeeds, Slot, model_needs, slot_models
from deploy.settings import TierConfig
from framerelay.model_registry import ModelRegistry

Change = Literal["ready", "unhealthy", "canary_not_ready"]


def apply_probe(
    worker: WorkerState, probe: Probe, now: float, unhealthy_after: int
) -> Change | None:
    """Fold one probe into ``worker``; what changed: it turned ready, it turned unhealthy,
    it is still not ready (``canary_not_ready``), or nothing worth an event (None)."""
    if probe.canary_ok is not None:
        worker.last_canary = now
    if probe.capacity_fps > 0:
        worker.capacity_fps = probe.capacity_fps
    if probe.ms_per_inference > 0 and worker.processing_ms is None:  # until the ingest measured
        worker.processing_ms = round(probe.ms_per_inference, 3)
    if probe.alive and probe.ready is True:  # its /info was read: models as it says now
        worker.models = probe.worker_models
    if not (probe.alive and probe.ready is not False and probe.canary_ok is not False):
        worker.fails += 1
        worker.last_error = (probe.error or "failed")[:500]
        # a worker that says it is not ready (/readyz) loses its streams on this pass
        if worker.ready and (worker.fails >= unhealthy_after or probe.ready is False):
            worker.ready = False
            return "unhealthy"
        return None if worker.ready else "canary_not_ready"
    worker.fails, worker.last_ok, worker.last_error = 0, now, None
    if probe.canary_ok:
        worker.canary_ms = round(probe.canary_ms, 1)
        if not worker.ready:
            worker.ready, worker.ready_since = True, now
            return "ready"
    return None


def worker_unhealthy(
    worker: WorkerState, created_at: float, now: float, unhealthy_after: int, grace_s: float
) -> bool:
    """Failed ``unhealthy_after`` times in a row after being ready once, or never ready
    within ``grace_s`` of the pod's creation."""
    if worker.ready:
        return False
    if worker.ready_since is not None:  # was ready once, then failed
        return worker.fails >= unhealthy_after
    return now - created_at > grace_s


def pod_unhealthy(rec: PodRecord, now: float, unhealthy_after: int, grace_s: float) -> bool:
    """Any worker of the pod unhealthy (a pod whose create never reached the provider
    is not: it is retried instead)."""
    if rec.state == "creating" and rec.provider_id is None:
        return False
    return any(
        worker_unhealthy(w, rec.created_at, now, unhealthy_after, grace_s) for w in rec.workers()
    )


def pod_load(rec: PodRecord, load: Mapping[str, int]) -> int:
    """Streams on the pod's workers (``load``: worker name -> streams)."""
    return sum(load.get(w.name, 0) for w in rec.workers())


def stream_load(assigned: Mapping[str, str]) -> collections.Counter[str]:
    """Streams per worker, from stream -> worker assignments."""
    return collections.Counter(assigned.values())


def by_name(pods: Iterable[PodRecord]) -> dict[str, tuple[PodRecord, WorkerState]]:
    """Every worker of ``pods`` by its name, with its pod."""
    return {w.name: (rec, w) for rec in pods for w in rec.workers()}


def move_reason(old: str | None, new: str | None, ready: set[str], pin: str | None) -> str:
    """Why placement moved a stream from ``old`` to ``new`` (``ready``: the workers that
    take streams now; ``pin``: the operator's choice)."""
    if old is not None and old not in ready:
        where = f"re-homed on {new}" if new else "no other allowed worker has room yet"
        return f"worker {old} is lost or not ready: {where}"
    if new is None:
        return "unplaced: no allowed worker has room"
    if old is None:
        return "placed"
    if pin == new:
        return "moved by an operator (pin)"
    return f"moved from {old}: cheaper, or {old} is over capacity or not allowed"


def fleet_model_needs(registry: ModelRegistry, pods: Iterable[PodRecord]) -> ModelNeeds:
    """Each model's memory (the registry's ``vram_mb``) and load time (the longest any
    worker of ``pods`` reported), for model-aware placement."""
    vram = {name: entry.vram_mb for name, entry in registry.entries.items()}
    return model_needs(vram, (w.models for rec in pods for w in rec.workers()))


def pod_slots(rec: PodRecord, tier: TierConfig, default_fps: float, use: float) -> list[Slot]:
    """The pod's ready workers as placement sees them: each GPU's capacity (the tier's,
    else measured, else ``default_fps``) times ``use`` (target utilisation), its share of
    the pod's price, and its models (as its last ``/info`` said)."""
    usd = rec.cost_per_hr / rec.gpu_count
    slots = []
    for w in (w for w in rec.workers() if w.ready):
        cap = (tier.capacity_fps or w.capacity_fps or default_fps) * use
        models = slot_models(w.models)
        slots.append(
            Slot(
                w.name, rec.tier, not tier.takes_critical, cap, usd, 0.0, tier.batch_only, **models
            )
        )
    return slots
