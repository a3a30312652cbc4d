"""The fleet's model-aware placement, without processes (issue 17).

A probe carries the worker's models (budget, loaded, default: its ``/info``) into the
worker's state, which is kept in Redis (records from before the field still load);
the fleet's slots carry them, and the registry's memory needs decide where a model
fits. ``StreamSpec.model`` follows the registry's name rule, and an orchestrator with
a registry refuses a model it lacks: a 422 that names what it has.
"""

from __future__ import annotations

import json
import math
import secrets
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from pydantic import ValidationError

from deploy.api import create_app
from deploy.clock import FakeClock
from deploy.fleet import Fleet
from deploy.health import Probe, StatusProber
from deploy.ingest_link import NullIngestLink
from deploy.models import STORED, PodRecord, StreamSpec, WorkerModels
from deploy.placement import place
from deploy.service import Orchestrator
from deploy.settings import TierConfig
from deploy.workers import fleet_model_needs
from framerelay.model_registry import MODEL_NAME, load_registry
from tests.support.auth import ed_keys, mint
from tests.support.orchestrator import MODEL_REGISTRY, orch_settings, serving_here


def _info(*loaded: tuple[str, float, int], budget: float = 600) -> dict[str, Any]:
    """A worker's ``/info``: the pinned default model and ``loaded`` (name, MiB, streams)."""
    default = {"name": "yolox_nano", "vram_mb": 256.0, "loaded": True, "pinned": True,
               "streams": 0, "load_s": 0.0}  # fmt: skip
    models = [default] + [
        {"name": n, "vram_mb": mb, "loaded": True, "pinned": False, "streams": s, "load_s": 0.4}
        for n, mb, s in loaded
    ]
    return {"default_model": "yolox_nano", "vram_budget_mb": budget, "models": models}


def _pod(slot: int) -> PodRecord:
    return PodRecord(name=f"fr-ondemand-{slot}-g0", tier="ondemand", slot=slot, gen=0,
                     spot=False, state="running", provider_id=f"p{slot}",
                     cost_per_hr=0.5)  # fmt: skip


def _fleet(tmp_path: Path, registry: Path | None = None) -> Fleet:
    none = cast(Any, None)  # _slots / _apply_probe touch neither provider, store nor links
    tiers = [TierConfig(name="ondemand", max_workers=2, capacity_fps=20)]
    settings = orch_settings(tmp_path, tiers=tiers, model_registry=registry)
    return Fleet(settings, none, none, none, none, FakeClock(1000.0),
                 registry=load_registry(registry))  # fmt: skip


def _registry(tmp_path: Path) -> Path:
    path = tmp_path / "models.toml"
    path.write_text(MODEL_REGISTRY)
    return path


def _probe(info: dict[str, Any]) -> Probe:
    return Probe(alive=True, canary_ok=True, persons=5, canary_ms=40.0, capacity_fps=20.0,
                 ready=True, worker_models=WorkerModels.from_info(info))  # fmt: skip


def test_a_probe_keeps_the_workers_models_in_its_state_and_its_slot(tmp_path: Path) -> None:
    fleet, rec = _fleet(tmp_path), _pod(0)
    fleet._apply_probe(rec, _probe(_info(("vehicles", 300, 1))), 1000.0)
    assert rec.ready and rec.models is not None
    assert rec.models.loaded == {"yolox_nano": 256.0, "vehicles": 300.0}
    assert rec.models.pinned == ("yolox_nano",) and rec.models.default == "yolox_nano"
    assert rec.models.load_s == {"yolox_nano": 0.0, "vehicles": 0.4}
    (slot,) = fleet._slots({rec.name: rec})
    assert (slot.vram_budget_mb, dict(slot.loaded), slot.pinned) == (
        600.0, {"yolox_nano": 256.0, "vehicles": 300.0}, frozenset({"yolox_nano"})
    )  # fmt: skip
    back = PodRecord.model_validate_json(rec.model_dump_json())  # as kept in Redis
    assert back.models == rec.models
    # a failed probe keeps what was known; a worker from before models is unknown again
    fleet._apply_probe(rec, Probe(alive=False, error="down"), 1001.0)
    assert rec.models is not None
    fleet._apply_probe(rec, _probe({"capacity_fps": 20}), 1002.0)
    assert rec.models is None and fleet._slots({rec.name: rec})[0].vram_budget_mb is None


def test_records_written_before_worker_models_still_load(tmp_path: Path) -> None:
    old = json.loads(_pod(0).model_dump_json())
    del old["models"]  # as an orchestrator from before this field wrote it
    two = {**old, "name": "fr-big-0-g0", "gpu_count": 2,
           "gpus": [{"name": "fr-big-0-g0-gpu0", "ready": True}]}  # fmt: skip
    assert PodRecord.model_validate_json(json.dumps(old)).models is None
    assert PodRecord.model_validate_json(json.dumps(two)).gpus[0].models is None


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        ({"capacity_fps": 3}, None),  # a worker from before models
        ({"vram_budget_mb": -1, "models": []}, None),
        ({"vram_budget_mb": math.inf, "models": []}, None),
        ({"vram_budget_mb": 0, "models": "x"}, None),
        (  # implausible entries skipped; an idle unpinned model that is not loaded too
            {"vram_budget_mb": 0, "default_model": "bad name", "models": [
                {"name": "../x", "vram_mb": 1, "loaded": True},
                {"name": "a", "vram_mb": math.nan, "loaded": True},
                {"name": "b", "vram_mb": 5, "loaded": False},
                {"name": "c", "vram_mb": 5, "loaded": True, "load_s": -1},
                7,
            ]},
            WorkerModels(budget_mb=0, loaded={"c": 5.0}),
        ),
    ],
)  # fmt: skip
def test_worker_models_read_info_tolerantly(
    info: dict[str, Any], expected: WorkerModels | None
) -> None:
    assert WorkerModels.from_info(info) == expected


def test_the_fleet_sends_a_model_where_it_fits_beside_the_models_with_streams(
    tmp_path: Path,
) -> None:
    """Worker 0 holds the default model and "vehicles" with a stream (556 of 600 MiB):
    a "trucks" stream (300 MiB by the registry) goes to worker 1, though best fit alone
    would pick the fuller worker 0 (which would refuse it: model_capacity). Another
    "vehicles" stream joins worker 0 (loaded there). Without the registry the fleet does
    not know what "trucks" needs."""
    fleet = _fleet(tmp_path, _registry(tmp_path))
    a, b = _pod(0), _pod(1)
    fleet._apply_probe(a, _probe(_info(("vehicles", 300, 1))), 1000.0)
    fleet._apply_probe(b, _probe(_info()), 1000.0)
    pods = {a.name: a, b.name: b}
    cars = StreamSpec(id="cars", url="x", fps=5, model="vehicles")
    trucks = StreamSpec(id="trucks", url="x", fps=5, model="trucks")
    cars2 = StreamSpec(id="cars2", url="x", fps=5, model="vehicles")
    needs = fleet_model_needs(fleet.registry, pods.values())
    assert needs.mb("trucks") == 300 and needs.load_s["vehicles"] == 0.4
    out = place([cars, trucks, cars2], fleet._slots(pods), {"cars": a.name}, {}, models=needs)
    assert out.assign == {"cars": a.name, "trucks": b.name, "cars2": a.name}
    assert out.unplaced == []
    unaware = place([cars, trucks], fleet._slots(pods), {"cars": a.name}, {})
    assert unaware.assign["trucks"] == a.name  # what the fleet did before: refused there


def test_without_a_registry_a_models_memory_is_what_a_worker_that_loaded_it_says(
    tmp_path: Path,
) -> None:
    fleet = _fleet(tmp_path)  # the built-in registry only
    a, b, c = _pod(0), _pod(1), _pod(2)
    fleet._apply_probe(a, _probe(_info(("vehicles", 300, 1))), 1000.0)
    fleet._apply_probe(b, _probe(_info(("trucks", 320, 0))), 1000.0)
    fleet._apply_probe(c, _probe(_info()), 1000.0)
    pods = {p.name: p for p in (a, b, c)}
    needs = fleet_model_needs(fleet.registry, pods.values())
    assert (needs.mb("yolox_nano"), needs.mb("vehicles"), needs.mb("trucks")) == (256, 300, 320)
    assert needs.mb("other") == 0  # loaded nowhere, unknown: the workers decide
    trucks = StreamSpec(id="trucks", url="x", fps=5, model="trucks")
    cars = StreamSpec(id="cars", url="x", fps=5, model="vehicles")
    out = place([cars, trucks], fleet._slots(pods), {"cars": a.name}, {}, models=needs)
    assert out.assign == {"cars": a.name, "trucks": b.name}  # loaded there wins


GOOD = ["yolox_nano", "vehicles", "YOLO11n.v2", "a", "m-1_2.x", "x" * 64]
BAD = ["", "a b", "../x", "-x", ".x", "x" * 65, "vehículos", "a/b", "a\nb"]


@pytest.mark.parametrize("name", GOOD)
def test_a_stream_may_name_a_model_by_the_registrys_rule(name: str) -> None:
    assert StreamSpec(id="c", url="x", model=name).model == name


@pytest.mark.parametrize("name", BAD)
def test_a_model_name_outside_the_rule_is_refused(name: str) -> None:
    with pytest.raises(ValidationError) as err:
        StreamSpec(id="c", url="x", model=name)
    assert [e["loc"] for e in err.value.errors()] == [("model",)]


async def test_a_stream_stored_before_the_rule_still_loads_from_the_store() -> None:
    """A stream written when the model was only a demand weight ("yolo v8") loads when read
    back as stored (``context=STORED``), so one old record cannot stop every pass."""
    raw = json.dumps({"id": "old", "url": "x", "model": "yolo v8"})
    assert StreamSpec.model_validate_json(raw, context=STORED).model == "yolo v8"
    with pytest.raises(ValidationError):
        StreamSpec.model_validate_json(raw)
    schema = StreamSpec.model_json_schema()["properties"]["model"]
    assert schema["pattern"] == MODEL_NAME and schema["maxLength"] == 64  # the API documents it

    async def through_the_store() -> str:
        from redis.asyncio import Redis

        from deploy.store import Store

        redis = Redis.from_url("redis://127.0.0.1:6379/0")
        store = Store(redis, f"test-legacy-{secrets.token_hex(6)}:")
        try:
            await redis.hset(store.p + "streams", "old", raw)
            return (await store.streams())["old"].model
        finally:
            await redis.delete(store.p + "streams")
            await redis.aclose()

    assert await through_the_store() == "yolo v8"


@pytest.mark.integration
async def test_the_api_refuses_bad_and_unknown_model_names_with_a_clear_422(tmp_path: Path) -> None:
    """With a registry: a known model is taken (201), an unknown one is a 422 naming the
    registry's models (never the submitted name), a malformed one a 422 on body.model.
    Without one: any well-formed name is taken (the workers' registries decide)."""

    async def post_all(registry: Path | None, models: list[str]) -> list[httpx.Response]:
        keys = ed_keys()
        settings = orch_settings(tmp_path, keys, model_registry=registry)
        orch = Orchestrator(settings, prober=StatusProber(20), ingest=NullIngestLink())
        auth = {"Authorization": f"Bearer {mint(keys, ['fleet:write'], 'orchestrator')}"}
        try:
            async with serving_here(create_app(orch)) as url, httpx.AsyncClient() as http:
                out = []
                for i, model in enumerate(models):
                    body = {"id": f"c{i}", "url": "x", "model": model}
                    out.append(await http.post(f"{url}/v1/streams", headers=auth, json=body))
                return out
        finally:
            await orch.store.clear()
            await orch.aclose()

    with_registry = await post_all(
        _registry(tmp_path), ["vehicles", "yolox_nano", "vehicels", "bad name"]
    )
    assert [r.status_code for r in with_registry] == [201, 201, 422, 422]
    (unknown,) = with_registry[2].json()["detail"]
    assert unknown["loc"] == ["body", "model"] and unknown["type"] == "unknown_model"
    assert "trucks, vehicles, yolox_nano" in unknown["msg"] and "vehicels" not in unknown["msg"]
    (malformed,) = with_registry[3].json()["detail"]
    assert malformed["loc"] == ["body", "model"] and "bad name" not in with_registry[3].text
    without = await post_all(None, ["vehicles", "bad name"])
    assert [r.status_code for r in without] == [201, 422]
