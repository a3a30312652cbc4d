"""IO binding through the CPU provider with the real model and frames; the GPU path
(TensorRT FP16 engines cached, CUDA with IO binding) on a GPU machine only."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from framerelay.detections import Detections
from framerelay.errors import ConfigError
from gpu_worker.detectors import ModelInput, load_detector, settings_for_model
from gpu_worker.detectors import ort_providers as op
from gpu_worker.detectors.io_binding import BoundRunner
from gpu_worker.detectors.onnx_backend import OnnxDetector
from gpu_worker.server import Worker
from gpu_worker.settings import WorkerSettings
from tests.conftest import MODEL
from tests.support.auth import mint
from tests.support.detector_io import first_frames
from tests.support.promtool import promtool


def _detector(**overrides: Any) -> OnnxDetector:
    det = load_detector(settings_for_model(MODEL, confidence_threshold=0.3, **overrides))
    assert isinstance(det, OnnxDetector)
    return det


@pytest.fixture(scope="module")
def frames() -> list[ModelInput]:
    return first_frames(3)


@pytest.fixture(scope="module")
def plain() -> OnnxDetector:
    return _detector(io_binding="off")


def test_cpu_defaults_report_nothing_accelerated(plain: OnnxDetector) -> None:
    assert plain.providers == (op.CPU,)
    assert plain.acceleration.as_info() == {
        "fp16": False,
        "io_binding": False,
        "engine_cache_dir": None,
        "in_graph_prep": False,
        "in_graph_post": False,
        "batch_buckets": [],
        "artefact_cache": None,
        "artefact_key": None,
    }
    auto = _detector()  # auto: off on the CPU provider
    assert not auto.acceleration.io_binding


@pytest.mark.parametrize("max_batch", [1, 8])
def test_io_binding_gives_the_same_detections(
    plain: OnnxDetector, frames: list[ModelInput], max_batch: int
) -> None:
    bound = _detector(io_binding="on", max_batch=max_batch)
    assert bound.acceleration.io_binding and bound.providers == (op.CPU,)
    expected = plain.infer(frames)
    got = bound.infer(frames)
    assert sum(len(d) for d in got) >= 15  # real people found in each frame
    for a, b in zip(got, expected, strict=True):
        assert a.equals(b, atol=0.0)


async def _serve_and_read(worker: Worker, token: str) -> tuple[dict[str, Any], str]:
    host, port = await worker.start()
    stop = asyncio.Event()
    task = asyncio.create_task(worker.serve_forever(stop))
    try:
        async with httpx.AsyncClient(base_url=f"http://{host}:{port}") as http:
            auth = {"Authorization": f"Bearer {token}"}
            info = (await http.get("/info", headers=auth)).json()
            metrics = (await http.get("/metrics")).text
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
    return info, metrics


async def test_info_metrics_and_hello_say_what_is_really_on() -> None:
    secret = "s" * 32
    settings = WorkerSettings(
        host="127.0.0.1", port=0, worker_id="acc", token_secrets=secret, warmup_runs=1,
        detector=settings_for_model(MODEL, io_binding="on", threads=1),
    )  # fmt: skip
    worker = Worker(settings)
    info, metrics = await _serve_and_read(worker, mint(secret, "worker:acc", "worker"))
    assert info["providers"] == [op.CPU] == worker.hello.providers
    assert (info["fp16"], info["io_binding"], info["engine_cache_dir"]) == (False, True, None)
    assert 'framerelay_worker_provider_info{provider="CPUExecutionProvider"} 1.0' in metrics
    assert 'framerelay_worker_detector_info{fp16="false",io_binding="true"} 1.0' in metrics
    assert promtool(metrics) == (0, "")


class _HostAllocator:
    """Stands in for libcudart: cudaHostAlloc/cudaFreeHost over libc malloc/free."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"))
        self._libc.malloc.restype = ctypes.c_void_p
        self._libc.free.argtypes = [ctypes.c_void_p]
        self.allocated: list[int] = []
        self.freed: list[int] = []

    def cudaHostAlloc(self, ref: Any, size: ctypes.c_size_t, flags: int) -> int:
        ref._obj.value = self._libc.malloc(size.value)
        self.allocated.append(ref._obj.value)
        return 0

    def cudaFreeHost(self, pointer: ctypes.c_void_p) -> int:
        self._libc.free(pointer)
        self.freed.append(int(pointer.value or 0))
        return 0


def test_outputs_into_preallocated_host_buffers(
    plain: OnnxDetector, frames: list[ModelInput]
) -> None:
    fake = _HostAllocator()
    runner = BoundRunner(plain._session, "cpu", cudart=fake)
    assert runner.pinned_outputs
    tensor = plain._to_tensor(frames)
    want = plain._session.run(None, {plain._input_name: tensor})[0]
    first = runner.run(tensor)
    np.testing.assert_array_equal(first, want)
    assert runner.run(tensor) is first  # one buffer per thread and batch size, reused
    runner.run(tensor[:1])
    assert len(fake.allocated) == 2
    del runner, first
    assert sorted(fake.freed) == sorted(fake.allocated)


def test_unwritable_engine_cache_fails_before_tensorrt_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "file").write_text("x")
    monkeypatch.setattr(ort, "get_available_providers", lambda: [op.TENSORRT, op.CPU])
    with pytest.raises(ConfigError, match="not writable"):
        _detector(providers="tensorrt", engine_cache_dir=tmp_path / "file" / "trt")


def _cuda_or_skip() -> None:
    if op.CUDA not in ort.get_available_providers():
        pytest.skip("this onnxruntime has no CUDA provider (install onnxruntime-gpu)")
    probe = ort.InferenceSession(str(MODEL), providers=[op.CUDA, op.CPU])
    if op.CUDA not in probe.get_providers():
        pytest.skip("onnxruntime-gpu is installed but no CUDA GPU is usable here")


def _matched(cpu: Detections, gpu: Detections, min_iou: float) -> None:
    """Every confident CPU box has a GPU box of the same class close to it."""
    sure = cpu[cpu.confidence >= 0.5]
    assert abs(len(gpu[gpu.confidence >= 0.5]) - len(sure)) <= 1
    for box, cls in zip(sure.xyxy, sure.class_id, strict=True):
        same = gpu.xyxy[gpu.class_id == cls]
        assert len(same) and max(_iou(box, b) for b in same) >= min_iou


@pytest.mark.gpu
def test_cuda_io_binding_matches_the_cpu(plain: OnnxDetector, frames: list[ModelInput]) -> None:
    _cuda_or_skip()
    cuda = _detector(providers="cuda", io_binding="auto", in_graph_post="off")  # raw: pinned
    assert cuda.providers[0] == op.CUDA and cuda.acceleration.io_binding
    assert cuda._runner is not None and cuda._runner.pinned_outputs
    for a, b in zip(plain.infer(frames), cuda.infer(frames), strict=True):
        _matched(a, b, min_iou=0.98)


@pytest.mark.gpu
def test_cuda_in_graph_post_matches_the_cpu(plain: OnnxDetector, frames: list[ModelInput]) -> None:
    """auto on a GPU provider: box decode, top-k and NMS run on the device."""
    _cuda_or_skip()
    cuda = _detector(providers="cuda", max_batch=4)
    assert cuda.acceleration.in_graph_post and cuda.acceleration.in_graph_prep
    for a, b in zip(plain.infer(frames), cuda.infer(frames), strict=True):
        _matched(a, b, min_iou=0.98)


@pytest.mark.gpu
def test_tensorrt_fp16_engine_cache_is_reused(
    plain: OnnxDetector, frames: list[ModelInput], tmp_path: Path
) -> None:
    _cuda_or_skip()
    if op.TENSORRT not in ort.get_available_providers():
        pytest.skip("this onnxruntime has no TensorRT provider")
    t0 = time.perf_counter()
    first = _detector(providers="tensorrt", engine_cache_dir=tmp_path, max_batch=4)
    if first.providers[0] != op.TENSORRT:
        pytest.skip(f"TensorRT libraries did not load; providers {first.providers}")
    first.infer(frames)  # TensorRT builds its engine at the first run
    cold_s = time.perf_counter() - t0
    assert first.acceleration.fp16 and first.acceleration.engine_cache_dir == tmp_path.resolve()
    cached = sorted(p.name for p in tmp_path.iterdir())
    assert any(n.endswith(".engine") for n in cached), cached
    assert any("timing" in n for n in cached), cached
    t0 = time.perf_counter()
    second = _detector(providers="tensorrt", engine_cache_dir=tmp_path, max_batch=4)
    got = second.infer(frames)
    warm_s = time.perf_counter() - t0
    assert sorted(p.name for p in tmp_path.iterdir()) == cached  # reused, nothing rebuilt
    assert warm_s < cold_s, (warm_s, cold_s)
    for a, b in zip(plain.infer(frames), got, strict=True):
        _matched(a, b, min_iou=0.9)  # FP16


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union)
