"""Model-aware placement (issue 17).

With a real worker (in this process, loopback, the real COCO model and the derived
"vehicles" model): placement reads the worker's ``/info``; a stream whose model is loaded
nowhere goes to the worker with room in its VRAM budget - not left unplaced, which would
add a pod - and that worker loads the model when the stream opens. A model that does not
fit beside models with streams is left unplaced (a pod would be added). Then the rules
without sockets: loaded wins at equal price, price first, idle models do not block, slots
whose models are unknown take any model.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.ingest_link import definition_key, stream_config
from deploy.models import StreamSpec
from deploy.placement import ModelNeeds, Slot, place, worker_models
from framerelay.results import ResultRecord
from ingest.settings import StreamConfig
from tests.conftest import CLIP, TIMEOUT_FACTOR
from tests.support.models import write_registry
from tests.support.waiting import wait_until_async
from tests.support.worker_harness import running_worker, streaming, token

WAIT_S = 60 * TIMEOUT_FACTOR
NEEDS = ModelNeeds({"yolox_nano": 256, "vehicles": 300, "vehicles2": 300})
EXTRA = """
[models.vehicles2]
file = "vehicles.onnx"
input_w = 416
input_h = 416
classes = ["car", "bus", "truck"]
vram_mb = 300
canary = { image = "vehicles.onnx", expect = { car = 1 } }
"""


def _spec(sid: str, model: str) -> StreamSpec:
    return StreamSpec(id=sid, url="x.mp4", fps=5, model=model)


def _slot(name: str, **models: Any) -> Slot:
    return Slot(name, "t", False, 100.0, 1.0, **models)


async def _info(http: httpx.AsyncClient, url: str, secret: str) -> dict[str, Any]:
    base = url.replace("ws://", "http://").removesuffix("/v1/tunnel")
    resp = await http.get(f"{base}/info", headers={"Authorization": f"Bearer {token(secret)}"})
    resp.raise_for_status()
    info: dict[str, Any] = resp.json()
    return info


@pytest.mark.integration
async def test_a_model_loaded_nowhere_is_placed_where_it_fits_and_loaded_there(
    secret: str, tmp_path: Path
) -> None:
    registry = write_registry(tmp_path, extra=EXTRA)
    records: list[ResultRecord] = []
    full = _slot("gpu-full", vram_budget_mb=256, loaded={"yolox_nano": 256},
                 pinned=frozenset({"yolox_nano"}))  # fmt: skip

    http = httpx.AsyncClient(timeout=10)
    async with running_worker(secret, model_registry=registry, vram_budget_mb=600) as (
        _,
        url,
    ):
        real = _slot("gpu-a", **worker_models(await _info(http, url, secret)))
        streams = [_spec("people", "yolox_nano"), _spec("cars", "vehicles")]
        first = place(streams, [full, real], {}, {}, models=NEEDS)
        config = StreamConfig(
            id="cars", url=str(CLIP), fps=5, realtime=True, loop=True, model="vehicles"
        )
        t0 = time.monotonic()
        async with streaming(url, token(secret), records, config):
            await wait_until_async(lambda: bool(records), WAIT_S, "a result of the vehicles model")
            first_result_s = time.monotonic() - t0
            info = await _info(http, url, secret)
            real = _slot("gpu-a", **worker_models(info))
            more = [*streams, _spec("trucks", "vehicles2")]
            full2 = _slot(
                "gpu-full",
                **worker_models(
                    {
                        "vram_budget_mb": 256,
                        "models": [
                            {
                                "name": "yolox_nano",
                                "vram_mb": 256,
                                "loaded": True,
                                "pinned": True,
                            }
                        ],
                    }
                ),
            )
            second = place(more, [full2, real], first.assign, {}, models=NEEDS)
    await http.aclose()

    assert first.assign["cars"] == "gpu-a" and first.unplaced == []  # not a new pod
    loaded = {m["name"]: m for m in info["models"]}
    assert loaded["vehicles"]["loaded"] is True and loaded["vehicles"]["streams"] == 1
    assert {r.model for r in records} == {"vehicles"}
    assert second.assign["cars"] == "gpu-a" and set(second.assign) == {"people", "cars"}
    assert second.unplaced == ["trucks"]  # 256 + 300 held with streams: no room for 300
    print(f"\nvehicles loaded on demand in {loaded['vehicles']['load_s']:.3f} s; first result "
          f"{first_result_s:.2f} s after the stream started")  # fmt: skip


def test_a_worker_with_the_model_loaded_wins_at_equal_price() -> None:
    cold = _slot("a-cold", vram_budget_mb=1000, loaded={})
    warm = _slot("b-warm", vram_budget_mb=1000, loaded={"vehicles": 300})
    placed = place([_spec("cars", "vehicles")], [cold, warm], {}, {}, models=NEEDS)
    assert placed.assign == {"cars": "b-warm"}


def test_price_comes_before_the_load() -> None:
    cheap = Slot("cheap", "t", True, 100.0, 0.5, vram_budget_mb=1000, loaded={})
    warm = _slot("warm", vram_budget_mb=1000, loaded={"vehicles": 300})
    placed = place([_spec("cars", "vehicles")], [cheap, warm], {}, {}, models=NEEDS)
    assert placed.assign == {"cars": "cheap"}


def test_idle_models_do_not_block_but_models_with_streams_do() -> None:
    slot = _slot("a", vram_budget_mb=600, loaded={"yolox_nano": 256, "vehicles": 300},
                 pinned=frozenset({"yolox_nano"}))  # fmt: skip
    placed = place([_spec("t", "vehicles2")], [slot], {}, {}, models=NEEDS)
    assert placed.assign == {"t": "a"}  # the idle vehicles model is evicted there
    slot = _slot("a", vram_budget_mb=600, loaded={"yolox_nano": 256},
                 pinned=frozenset({"yolox_nano"}))  # fmt: skip
    both = place([_spec("c", "vehicles"), _spec("t", "vehicles2")], [slot], {}, {}, models=NEEDS)
    assert len(both.assign) == 1 and len(both.unplaced) == 1


def test_slots_whose_models_are_unknown_take_any_model() -> None:
    placed = place([_spec("c", "vehicles")], [_slot("old")], {}, {}, models=NEEDS)
    assert placed.assign == {"c": "old"}


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        ({"capacity_fps": 3}, {}),
        (  # no budget: room for any model, but one that has it loaded still wins
            {"vram_budget_mb": 0, "models": []},
            {"vram_budget_mb": math.inf, "loaded": {}, "pinned": frozenset()},
        ),
        ({"vram_budget_mb": float("nan"), "models": []}, {}),
        (
            {
                "vram_budget_mb": 600,
                "models": [
                    {"name": "a", "vram_mb": 1, "loaded": False},
                    {"name": "b", "vram_mb": True, "loaded": True},
                    "x",
                ],
            },
            {"vram_budget_mb": 600.0, "loaded": {}, "pinned": frozenset()},
        ),
    ],
)
def test_worker_models_reads_info_tolerantly(
    info: dict[str, Any], expected: dict[str, Any]
) -> None:
    assert worker_models(info) == expected


def test_the_orchestrator_passes_a_streams_model_to_the_ingest() -> None:
    plain, named = _spec("c", "yolox_nano"), _spec("c", "vehicles")
    assert "model" not in stream_config(plain)  # older definitions keep their digest
    assert StreamConfig.model_validate(stream_config(named)).model == "vehicles"
    assert definition_key(plain) != definition_key(named)
