"""The model pool without sockets: lookups, the VRAM budget, LRU eviction, lazy loads."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import cast

import pytest

from framerelay.detections import Detections
from framerelay.errors import CapacityError, ConfigError, ModelError
from framerelay.model_registry import BUILTIN, CanarySpec, ModelEntry, ModelRegistry
from gpu_worker.detectors import ModelInput
from gpu_worker.model_pool import ModelPool, default_model


class _Fake:
    def __init__(self, size: tuple[int, int] = (416, 416), classes: int = 3) -> None:
        self.input_size = size
        self.class_names = tuple(f"c{i}" for i in range(classes))
        self.providers: tuple[str, ...] = ("CPUExecutionProvider",)

    def infer(self, batch: Sequence[ModelInput]) -> list[Detections]:
        return [Detections.empty() for _ in batch]


def _entry(name: str, vram_mb: float = 100, size: int = 416) -> ModelEntry:
    return ModelEntry(
        name=name, file=Path(f"/m/{name}.onnx"), input_w=size, input_h=size,
        classes=("c0", "c1", "c2"), vram_mb=vram_mb,
        canary=CanarySpec(image=Path("/x.jpg"), expect={"c0": 1}),
    )  # fmt: skip


class _Loads:
    def __init__(self) -> None:
        self.names: list[str] = []

    def __call__(self, entry: ModelEntry) -> _Fake:
        self.names.append(entry.name)
        if entry.name == "broken":
            raise ModelError("not an ONNX model")
        return _Fake()


def _pool(budget: float, *entries: ModelEntry) -> tuple[ModelPool, _Loads]:
    registry = ModelRegistry({BUILTIN.name: BUILTIN, **{e.name: e for e in entries}})
    loads = _Loads()
    default = default_model(BUILTIN.name, _Fake(classes=80), registry)
    return ModelPool(registry, default, loads, budget_mb=budget), loads


def test_the_default_model_is_pinned_and_described_by_its_detector() -> None:
    pool, _ = _pool(0)
    model = pool.acquire(None)
    assert model is pool.default and model.pinned and model.streams == 1
    assert model.entry.classes == tuple(f"c{i}" for i in range(80))
    assert pool.acquire(BUILTIN.name) is model


def test_loads_are_lazy_and_happen_once() -> None:
    pool, loads = _pool(0, _entry("a"))
    model = pool.acquire("a")
    assert loads.names == [] and model.loaded is None
    assert model.detector() is model.detector() and loads.names == ["a"]
    assert model.info()["loaded"] is True


def test_unknown_names_and_other_sizes_are_refused() -> None:
    pool, _ = _pool(0, _entry("big", size=640))
    with pytest.raises(ConfigError, match="unknown model 'x'; the registry has big, yolox_nano"):
        pool.acquire("x")
    with pytest.raises(ModelError, match="takes 640x640 images; this worker's tunnels carry"):
        pool.acquire("big")


def test_the_budget_evicts_the_least_recently_used_idle_model() -> None:
    pool, _ = _pool(556, _entry("a"), _entry("b"), _entry("c"), _entry("d"))  # 256 + 3 x 100
    a, b = pool.acquire("a"), pool.acquire("b")
    pool.release(a)
    pool.release(b)
    b.last_used, a.last_used = 1.0, 2.0  # b idle for longer
    pool.acquire("c")
    assert pool.free_mb == 0 and pool.evictions == 0  # it fitted: nothing evicted
    pool.acquire("d")
    assert set(pool.models) == {BUILTIN.name, "a", "c", "d"} and pool.evictions == 1


def test_a_model_with_streams_is_never_evicted() -> None:
    pool, _ = _pool(456, _entry("a", 200), _entry("b", 200))
    a = pool.acquire("a")
    with pytest.raises(CapacityError, match="model b needs 200 MiB; 0 of 456 MiB are free"):
        pool.acquire("b")
    assert set(pool.models) == {BUILTIN.name, "a"}
    pool.release(a)
    pool.acquire("b")
    assert set(pool.models) == {BUILTIN.name, "b"}


def test_a_failed_load_fails_its_frames_and_is_retried_after_its_streams() -> None:
    pool, loads = _pool(0, _entry("broken"))
    model = pool.acquire("broken")
    for _ in range(2):
        with pytest.raises(ModelError, match="model broken failed to load: not an ONNX model"):
            model.detector()
    assert loads.names == ["broken"]  # not reloaded for every frame
    pool.release(model)
    assert "broken" not in pool.models
    assert pool.acquire("broken") is not model


def test_info_and_hello() -> None:
    pool, _ = _pool(1000, _entry("a"), _entry("big", size=640))
    pool.acquire("a")
    info = pool.info()
    assert info["vram_used_mb"] == 356 and info["vram_free_mb"] == 644
    models = cast(list[dict[str, object]], info["models"])  # ServedModel.info() each
    assert [m["name"] for m in models] == [BUILTIN.name, "a"]
    assert [m.name for m in pool.hello_models()] == [BUILTIN.name, "a"]  # not 640x640


def test_hello_lists_as_many_models_as_its_header_holds() -> None:
    many = [_entry(f"m{i:02d}") for i in range(20)]
    pool, _ = _pool(0, *many)
    assert len(pool.hello_models()) == 16  # wire.MAX_MODELS
    listed = pool.hello_models(max_bytes=1200)  # the 80 COCO names take ~700
    assert 0 < len(listed) < 16 and listed[0].name == BUILTIN.name
