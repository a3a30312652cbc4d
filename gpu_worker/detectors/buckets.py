"""Batch sizes rounded up to a few buckets, each prepared once before serving.

ONNX Runtime's CUDA provider prepares every new input shape the first time it
sees it (kernel and cuDNN algorithm choices, memory plans): about 2-3 s per
batch size for the 416 YOLOX on an H200. A worker whose batches take every size
from 1 to ``max_batch`` as load comes and goes paid that in the middle of
serving: stalls of seconds, and tunnel throughput a tenth of the bare loop's.
With buckets a batch is padded up to the next power of two (or ``max_batch``),
so there are at most ``log2(max_batch) + 1`` shapes, and the detector runs each
once at start (:meth:`~gpu_worker.detectors.onnx_backend.OnnxDetector`).
Padding costs GPU work on the padded images, which the GPU has to spare; their
outputs are dropped.
"""

from __future__ import annotations

import bisect


def bucket_sizes(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, ... below ``max_batch``, then ``max_batch``."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    sizes, size = [], 1
    while size < max_batch:
        sizes.append(size)
        size *= 2
    return (*sizes, max_batch)


def bucket_for(n: int, sizes: tuple[int, ...]) -> int:
    """The smallest bucket that holds ``n`` images (``n`` itself when none does, or when
    there are no buckets)."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else n
