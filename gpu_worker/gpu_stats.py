"""Per-GPU readings from NVML (``pynvml``, from the ``nvidia-ml-py`` package).

:func:`read_gpus` answers a :class:`GpuStatus`: the GPUs this process may use
with their utilisation, memory, temperature and power, or ``available=False``
and the reason (``nvidia-ml-py`` not installed, the NVML library not found, no
device, ``CUDA_VISIBLE_DEVICES`` hiding them all). It never raises: a field a
GPU does not support (``NVML_ERROR_NOT_SUPPORTED``, e.g. power on some boards)
or that fails reads as ``None``.

NVML sees every GPU of the machine; CUDA sees only those in
``CUDA_VISIBLE_DEVICES``. The readings keep to the visible ones, matched by
index (NVML numbers GPUs in PCI bus order: pin with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
so CUDA's numbers are the same, as ``framerelay worker --gpus`` does) or by UUID
(``GPU-...``, a prefix is enough, as CUDA accepts). NVML is initialised once per
process, on first use; each reading is a few NVML calls (well under a
millisecond per GPU), so readings are taken when asked (a scrape, ``/info``),
never by a polling thread.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any

INSTALL_HINT = "install the gpu extra: pip install 'framerelay[gpu]' (nvidia-ml-py)"
_MILLI = 1000.0


@dataclass(frozen=True)
class GpuStats:
    """One GPU's readings; ``None`` where the GPU does not report a field."""

    index: int
    """NVML's index (PCI bus order), the number to pin with ``CUDA_VISIBLE_DEVICES``."""
    name: str
    uuid: str
    utilization_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None


@dataclass(frozen=True)
class GpuStatus:
    available: bool
    reason: str = ""
    gpus: list[GpuStats] = field(default_factory=list)
    cuda_visible_devices: str | None = None

    def as_info(self) -> dict[str, Any]:
        """JSON for ``/info``: availability, the reason when none, each GPU's readings."""
        return {
            "available": self.available,
            "reason": self.reason,
            "cuda_visible_devices": self.cuda_visible_devices,
            "devices": [asdict(g) for g in self.gpus],
        }


def visible_entries(value: str | None) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as entries; None when unset (every GPU visible).

    Like CUDA, reading stops at the first entry that is neither an index nor a
    UUID, and ``-1`` (or an empty value) hides every GPU.
    """
    if value is None:
        return None
    out: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        out.append(entry)
    return out


@dataclass(frozen=True)
class _Device:
    index: int
    handle: Any
    uuid: str
    name: str


class NvmlReader:
    """Reads the visible GPUs through ``nvml`` (the ``pynvml`` module, or a stand-in)."""

    def __init__(self, nvml: ModuleType | None = None, visible: str | None = None) -> None:
        self._nvml = nvml
        self._visible = visible
        self._lock = threading.Lock()
        self._devices: list[_Device] | None = None
        self._failure: str | None = None

    def read(self) -> GpuStatus:
        with self._lock:
            if self._devices is None and self._failure is None:
                self._failure = self._init()
            devices = self._devices
            if devices is None:
                return GpuStatus(False, self._failure or "", cuda_visible_devices=self._visible)
            gpus = [self._stats(d) for d in devices]
        return GpuStatus(True, "", gpus, self._visible)

    def _init(self) -> str | None:
        """None once the visible GPUs' handles are known; else why there are none."""
        nvml = self._nvml
        if nvml is None:
            try:
                nvml = self._nvml = importlib.import_module("pynvml")
            except ImportError:
                return f"nvidia-ml-py is not installed: {INSTALL_HINT}"
        try:
            nvml.nvmlInit()
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            return _init_failure(nvml, exc)
        every = [d for d in (_identify(nvml, i) for i in range(count)) if d is not None]
        chosen = _select(every, visible_entries(self._visible))
        if not chosen:
            if not every:
                return f"NVML found no usable GPU ({count} device(s), none readable)"
            return (
                f"CUDA_VISIBLE_DEVICES={self._visible!r} names none of the {len(every)} "
                f"GPU(s) NVML sees here"
            )
        self._devices = chosen
        return None

    def _stats(self, device: _Device) -> GpuStats:
        nvml: Any = self._nvml
        handle = device.handle
        util = _field(nvml, lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        memory = _memory(nvml, handle)
        temp = _field(
            nvml, lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        )
        power = _field(nvml, lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        limit = _field(nvml, lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
        return GpuStats(
            index=device.index,
            name=device.name,
            uuid=device.uuid,
            utilization_pct=None if util is None else float(util),
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_total_bytes=None if memory is None else int(memory.total),
            temperature_c=None if temp is None else float(temp),
            power_w=None if power is None else power / _MILLI,
            power_limit_w=None if limit is None else limit / _MILLI,
        )


def _text(value: object) -> str:
    """NVML strings: ``str`` from current bindings, ``bytes`` from old ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _identify(nvml: Any, index: int) -> _Device | None:
    """A GPU's handle, UUID and name; None for one NVML cannot open (lost, no permission)."""
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
    except nvml.NVMLError:
        return None
    name = _text(_field(nvml, lambda: nvml.nvmlDeviceGetName(handle)) or "unknown")
    return _Device(index, handle, uuid, name)


def _select(every: list[_Device], entries: list[str] | None) -> list[_Device]:
    """The GPUs ``CUDA_VISIBLE_DEVICES`` lets this process use, in its order."""
    if entries is None:
        return every
    out: list[_Device] = []
    for entry in entries:
        for gpu in every:
            hit = int(entry) == gpu.index if entry.isdigit() else gpu.uuid.startswith(entry)
            if hit and gpu not in out:
                out.append(gpu)
                break
    return out


def _field(nvml: Any, read: Callable[[], Any]) -> Any:
    """One reading; None when the GPU does not support it or NVML fails on it."""
    try:
        return read()
    except nvml.NVMLError:
        return None


def _memory(nvml: Any, handle: Any) -> Any:
    """Memory info v2 (``used`` without the driver's reservation, as ``nvidia-smi`` shows
    it); v1 (``used`` counts the reservation) from bindings or drivers without v2."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        v2 = _field(nvml, lambda: nvml.nvmlDeviceGetMemoryInfo(handle, version=version))
        if v2 is not None:
            return v2
    return _field(nvml, lambda: nvml.nvmlDeviceGetMemoryInfo(handle))


def _init_failure(nvml: Any, exc: Exception) -> str:
    code = getattr(exc, "value", None)
    if code == getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", None):
        return (
            "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver on this "
            "machine, or a container started without GPUs (--gpus / the NVIDIA runtime)"
        )
    if code == getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", None):
        return "the NVIDIA driver is not loaded (NVML: driver not loaded)"
    return f"NVML failed to start: {exc}"


_default: NvmlReader | None = None
_default_lock = threading.Lock()


def read_gpus() -> GpuStatus:
    """The GPUs this process may use, read now (NVML started on first call)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = NvmlReader(visible=os.environ.get("CUDA_VISIBLE_DEVICES"))
        reader = _default
    return reader.read()
