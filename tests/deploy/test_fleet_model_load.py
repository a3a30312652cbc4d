"""Acceptance (issue 17), in the product path: a stream whose model is loaded nowhere
makes a worker load it, not a new pod, and model-aware placement keeps a model off a
worker whose memory its streams' models already take.

The whole fleet runs for real: the orchestrator (Redis, the local provider starting
real worker processes with the CPU ONNX model, a model registry and a 600 MiB budget
each), and a real ingest behind its HTTP API reading the sample clip. The registry
adds two derived 3-class models ("vehicles" and "trucks", 300 MiB each; each worker's
default COCO model takes 256). Two warm pods; the tier could grow to three.

1. A "vehicles" stream: placed on a warm worker, which loads the model; its results
   name "vehicles". No pod is created.
2. A "trucks" stream: the first worker holds 256 + 300 MiB with streams, so it goes to
   the other worker (best fit alone would pick the fuller first one, which would
   refuse it), which loads it; its results name "trucks". Still no pod created.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from deploy.models import PodSpec, StreamSpec
from deploy.settings import TierConfig
from tests.conftest import CLIP
from tests.support.fleet import Fleet, running_fleet, settings_for
from tests.support.models import KITTI_STILL, write_registry
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.integration  # functional (no timing figure asserted): runs in parallel
TRUCKS = f"""
[models.trucks]
file = "vehicles.onnx"
format = "yolox"
input_w = 416
input_h = 416
classes = ["car", "bus", "truck"]
vram_mb = 300
canary = {{ image = "{KITTI_STILL}", expect = {{ car = 1 }}, min_confidence = 0.5 }}
"""
BUDGET_MB = 600
TIER = TierConfig(name="ondemand", min_warm=2, max_workers=3, capacity_fps=12)
RESULTS = 3
"""Results each stream must bring back, naming its model."""


def _stream(sid: str, model: str) -> StreamSpec:
    return StreamSpec(id=sid, url=str(CLIP), fps=2, loop=True, model=model)


async def _ready_workers(fleet: Fleet, n: int) -> list[str]:
    async def ready() -> bool:
        pods = (await fleet.orch.store.pods()).values()
        return sum(p.ready and p.models is not None for p in pods) == n

    await wait_until_async(ready, 120, f"{n} ready workers whose models are known")
    return sorted(await fleet.orch.store.pods())


async def _served(fleet: Fleet, spec: StreamSpec) -> tuple[str, float]:
    """Add ``spec``; (its worker, seconds to its RESULTS-th result naming its model)."""
    t0 = time.monotonic()
    await fleet.orch.store.put_stream(spec)

    def flowing() -> bool:
        return sum(r.model == spec.model for r in fleet.results_for(spec.id)) >= RESULTS

    await wait_until_async(flowing, 90, f"{RESULTS} results of the {spec.model} stream")
    took = time.monotonic() - t0
    worker = (await fleet.orch.store.assignments())[spec.id]
    assert {r.worker_id for r in fleet.results_for(spec.id)} == {worker}
    return worker, took


async def _loaded(fleet: Fleet, worker: str, model: str) -> None:
    """Wait until the worker's state (its /info, read by the probes) shows ``model``."""

    async def there() -> bool:
        models = (await fleet.orch.store.pods())[worker].models
        return models is not None and model in models.loaded

    await wait_until_async(there, 30, f"{model} loaded on {worker} in the fleet's records")


async def test_a_streams_model_is_loaded_on_a_warm_worker_with_room_not_on_a_new_pod(
    secret: str, tmp_path: Path
) -> None:
    registry = write_registry(tmp_path, extra=TRUCKS)

    def models_env(spec: PodSpec) -> dict[str, str]:
        return {"FRAMERELAY_WORKER_MODEL_REGISTRY": str(registry),
                "FRAMERELAY_WORKER_VRAM_BUDGET_MB": str(BUDGET_MB)}  # fmt: skip

    settings = settings_for(secret, tmp_path / "ca", tiers=[TIER], model_registry=registry)
    async with running_fleet(settings, env_hook=models_env) as fleet:
        workers = await _ready_workers(fleet, 2)
        cars_on, cars_s = await _served(fleet, _stream("cars", "vehicles"))
        await _loaded(fleet, cars_on, "vehicles")
        trucks_on, trucks_s = await _served(fleet, _stream("trucks", "trucks"))
        await _loaded(fleet, trucks_on, "trucks")
        await asyncio.sleep(1.5)  # three more passes: nothing moves, nothing is created
        pods = await fleet.orch.store.pods()
        kinds = [e["kind"] for e in fleet.orch.fleet.events]
        out: dict[str, Any] = {  # figures of several types, by name
            "workers": workers,
            "pods": sorted(pods),
            "created": kinds.count("created"),
            "moved": [e for e in fleet.orch.fleet.events if e["kind"] == "moved"],
            "launched": len(fleet.provider.pods),
            "unplaced": fleet.orch.fleet.unplaced,
            "assigned": await fleet.orch.store.assignments(),
            "cars_on": cars_on,
            "trucks_on": trucks_on,
            "cars_s": cars_s,
            "trucks_s": trucks_s,
            "models": {n: p.models for n, p in pods.items()},
        }

    print(f"\nmodel loaded on a warm worker: vehicles -> {out['cars_on']} ({out['cars_s']:.1f} s "
          f"to {RESULTS} results), trucks -> {out['trucks_on']} ({out['trucks_s']:.1f} s); "
          f"pods created {out['created']}")  # fmt: skip
    assert out["created"] == 2 and out["launched"] == 2  # the two warm pods, none more
    assert out["pods"] == out["workers"] and out["unplaced"] == []
    assert out["cars_on"] in out["workers"] and out["trucks_on"] in out["workers"]
    assert out["cars_on"] != out["trucks_on"]  # no room beside vehicles + the default model
    assert out["assigned"] == {"cars": out["cars_on"], "trucks": out["trucks_on"]}
    assert [e["stream"] for e in out["moved"]] == ["cars", "trucks"]  # placed once each
    models = out["models"]
    assert isinstance(models, dict)
    assert "trucks" not in models[out["cars_on"]].loaded
    assert "vehicles" not in models[out["trucks_on"]].loaded
