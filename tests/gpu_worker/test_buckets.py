"""Batch-size buckets: a batch is padded up to the next power of two (or max_batch), each
size prepared once at start, so ONNX Runtime never prepares a new shape while serving.

Seen on an H200 (CUDA provider): each new batch size cost 2-3 s at its first run, and a
worker whose batches took every size from 1 to 64 stalled for seconds at a time (tunnel
throughput 2.5-173 frames/s against 1,638 bare). Through the CPU provider here: same
detections with and without padding, only bucket sizes reach the model."""

from __future__ import annotations

from typing import Any

import pytest

from framerelay.detections import Detections
from gpu_worker.detectors import ModelInput, load_detector, settings_for_model
from gpu_worker.detectors.buckets import bucket_for, bucket_sizes
from gpu_worker.detectors.onnx_backend import OnnxDetector
from tests.conftest import MODEL
from tests.support.detector_io import first_frames, same_detections


def test_bucket_sizes() -> None:
    assert bucket_sizes(64) == (1, 2, 4, 8, 16, 32, 64)
    assert bucket_sizes(6) == (1, 2, 4, 6)
    assert bucket_sizes(1) == (1,)
    assert [bucket_for(n, bucket_sizes(6)) for n in range(1, 7)] == [1, 2, 4, 4, 6, 6]
    assert bucket_for(5, ()) == 5
    with pytest.raises(ValueError, match=">= 1"):
        bucket_sizes(0)


def _detector(**overrides: Any) -> OnnxDetector:
    det = load_detector(settings_for_model(MODEL, max_batch=8, **overrides))
    assert isinstance(det, OnnxDetector)
    return det


@pytest.fixture(scope="module")
def frames() -> list[ModelInput]:
    return first_frames(5)


@pytest.mark.parametrize("post", ["off", "on"])
def test_padded_batches_find_the_same_and_use_only_bucket_sizes(
    frames: list[ModelInput], post: str
) -> None:
    plain = _detector(in_graph_post=post, batch_buckets="off")
    padded = _detector(in_graph_post=post, batch_buckets="on")
    padded.prepare()  # each bucket once (the worker does it on its inference thread)
    assert padded.acceleration.batch_buckets == (1, 2, 4, 8)
    assert padded.acceleration.as_info()["batch_buckets"] == [1, 2, 4, 8]
    assert plain.acceleration.batch_buckets == ()
    sizes: list[int] = []
    to_tensor = padded._to_tensor

    def spy(batch: Any, size: int = 0) -> Any:
        tensor = to_tensor(batch, size)
        sizes.append(int(tensor.shape[0]))
        return tensor

    padded._to_tensor = spy  # type: ignore[method-assign]
    for n in (1, 3, 5):
        got: list[Detections] = padded.infer(frames[:n])
        same_detections(plain.infer(frames[:n]), got)
    assert sizes == [1, 4, 8]


def test_auto_is_off_on_the_cpu_provider() -> None:
    assert _detector().acceleration.batch_buckets == ()


async def test_the_worker_prepares_and_warms_up_on_its_inference_thread(secret: str) -> None:
    """The CUDA provider keeps per-thread state: the thread that runs inference is the one
    that must have seen every shape first (on the H200 the tunnel's first runs stalled)."""
    import asyncio
    import threading

    from gpu_worker.server import Worker
    from gpu_worker.settings import WorkerSettings

    det = _detector(batch_buckets="on")
    threads: list[str] = []
    prepare, infer = det.prepare, det.infer

    def spy_prepare() -> None:
        threads.append(f"prepare:{threading.current_thread().name}")
        prepare()

    def spy_infer(batch: Any) -> list[Detections]:
        threads.append(f"infer:{threading.current_thread().name}")
        return infer(batch)

    det.prepare, det.infer = spy_prepare, spy_infer  # type: ignore[method-assign]
    settings = WorkerSettings(host="127.0.0.1", port=0, worker_id="w", token_secrets=secret,
                              detector=settings_for_model(MODEL), warmup_runs=1)  # fmt: skip

    worker = Worker(settings, detector=det)
    await worker.start()
    stop = asyncio.Event()
    stop.set()
    await worker.serve_forever(stop)
    assert threads[:2] == ["prepare:infer_0", "infer:infer_0"], threads
