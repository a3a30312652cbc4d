"""Run an ONNX Runtime session through IO binding.

On a GPU provider the input is copied once to the device as an ``OrtValue`` and
the first output is written straight into page-locked ("pinned") host memory,
so the device-to-host copy is one DMA transfer instead of a staged one. ONNX
Runtime's Python API names no pinned device, so the buffers come from the CUDA
runtime (``cudaHostAlloc`` through ctypes, the library the CUDA provider has
already loaded); where it cannot be had, the output is bound to ordinary CPU
memory and the runner says so (``pinned_outputs``). With the CPU provider the
same code binds CPU memory on both sides, which is how it is tested without a GPU.

A pinned output array is reused by the next run on the same thread (one buffer
per thread and batch size): read it before running again.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import weakref
from typing import Any, Literal

import numpy as np
import onnxruntime as ort
from numpy.typing import NDArray

log = logging.getLogger(__name__)

Device = Literal["cpu", "cuda"]
_CUDART_NAMES = ("libcudart.so.12", "libcudart.so.13", "libcudart.so", "cudart64_12.dll")


def load_cudart() -> Any | None:
    """The CUDA runtime library, or None where there is none (no GPU packages)."""
    for name in _CUDART_NAMES:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


class PinnedArrays:
    """Page-locked float32 host arrays by (thread, shape), freed with this object."""

    def __init__(self, cudart: Any) -> None:
        self._cudart = cudart
        self._local = threading.local()
        self._pointers: list[int] = []
        self._lock = threading.Lock()
        weakref.finalize(self, _free_all, cudart, self._pointers)

    def get(self, shape: tuple[int, ...]) -> NDArray[np.float32]:
        cache: dict[tuple[int, ...], NDArray[np.float32]] = self._local.__dict__.setdefault(
            "arrays", {}
        )
        array = cache.get(shape)
        if array is None:
            array = cache[shape] = self._allocate(shape)
        return array

    def _allocate(self, shape: tuple[int, ...]) -> NDArray[np.float32]:
        count = int(np.prod(shape))
        pointer = ctypes.c_void_p()
        rc = self._cudart.cudaHostAlloc(ctypes.byref(pointer), ctypes.c_size_t(count * 4), 0)
        if rc != 0 or not pointer.value:
            raise MemoryError(f"cudaHostAlloc of {count * 4} bytes failed (CUDA error {rc})")
        with self._lock:
            self._pointers.append(pointer.value)
        buffer = (ctypes.c_float * count).from_address(pointer.value)
        return np.ctypeslib.as_array(buffer).reshape(shape)


def _free_all(cudart: Any, pointers: list[int]) -> None:
    for pointer in pointers:
        cudart.cudaFreeHost(ctypes.c_void_p(pointer))
    pointers.clear()


class BoundRunner:
    """``run(tensor) -> first output`` through IO binding; thread-safe per call.

    Outputs go to pinned memory on ``cuda`` (``cudart`` given: that library's
    allocator, on any device, which is how tests reach this path without a GPU).
    """

    def __init__(
        self,
        session: ort.InferenceSession,
        device: Device,
        device_id: int = 0,
        cudart: Any | None = None,
    ) -> None:
        self._session = session
        self._device: Device = device
        self._device_id = device_id
        self._input = session.get_inputs()[0].name
        output = session.get_outputs()[0]
        self._output = output.name
        self._tail = _fixed_tail(output.shape) if output.type == "tensor(float)" else None
        self._pinned: PinnedArrays | None = None
        if self._tail is not None and (cudart is not None or device == "cuda"):
            lib = cudart if cudart is not None else load_cudart()
            if lib is None:
                log.warning("no CUDA runtime library found: outputs go to pageable memory")
            else:
                self._pinned = PinnedArrays(lib)

    @property
    def device(self) -> Device:
        return self._device

    @property
    def pinned_outputs(self) -> bool:
        return self._pinned is not None

    def run(self, tensor: NDArray[Any]) -> NDArray[np.float32]:
        """One run on ``tensor`` (float32 NCHW, or uint8 NHWC with in-graph prep)."""
        binding = self._session.io_binding()
        value = ort.OrtValue.ortvalue_from_numpy(tensor, self._device, self._device_id)
        binding.bind_ortvalue_input(self._input, value)
        if self._pinned is not None and self._tail is not None:
            out = self._pinned.get((tensor.shape[0], *self._tail))
            binding.bind_output(
                self._output, "cpu", 0, np.float32, list(out.shape), out.ctypes.data
            )
            self._session.run_with_iobinding(binding)
            return out
        binding.bind_output(self._output, "cpu")
        self._session.run_with_iobinding(binding)
        result: Any = binding.copy_outputs_to_cpu()[0]
        return np.asarray(result, dtype=np.float32)

    def run_all(self, tensor: NDArray[Any]) -> list[NDArray[Any]]:
        """One run; every output, in the session's order, in ordinary host memory (sizes
        that depend on the data, e.g. the kept boxes of in-graph NMS)."""
        binding = self._session.io_binding()
        value = ort.OrtValue.ortvalue_from_numpy(tensor, self._device, self._device_id)
        binding.bind_ortvalue_input(self._input, value)
        for output in self._session.get_outputs():
            binding.bind_output(output.name, "cpu")
        self._session.run_with_iobinding(binding)
        return [np.asarray(o) for o in binding.copy_outputs_to_cpu()]


def _fixed_tail(shape: list[Any]) -> tuple[int, ...] | None:
    """The output's dimensions after the batch axis, when all are fixed integers."""
    tail = shape[1:]
    if not tail or not all(isinstance(d, int) and d > 0 for d in tail):
        return None
    return tuple(int(d) for d in tail)
