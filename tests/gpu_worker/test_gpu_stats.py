"""GPU readings (issue 14): NVML through ``pynvml``, and their ``/metrics`` series.

Without a GPU the real reader must answer ``available=False`` with a reason
and never raise. The reading logic (field errors, ``CUDA_VISIBLE_DEVICES``)
runs against a stand-in for the ``pynvml`` module; the collector's rendering
against fixed readings, checked by ``promtool``. The ``gpu`` test reads the
real NVML of a GPU machine.
"""

from __future__ import annotations

import shutil
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_worker.gpu_stats import GpuStats, GpuStatus, NvmlReader, read_gpus, visible_entries
from gpu_worker.metrics import WorkerMetrics
from tests.support.promtool import promtool

NOT_SUPPORTED, LIBRARY_NOT_FOUND, GPU_LOST = 3, 12, 15
GIB = 1 << 30


class FakeNvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_nvml(
    count: int = 3, *, init_error: int | None = None, unsupported: frozenset[str] = frozenset()
) -> types.ModuleType:
    """A stand-in for ``pynvml``: GPU i has UUID GPU-i..., i*10 % busy, i GiB used."""
    nvml = types.ModuleType("pynvml")
    attrs: dict[str, Any] = {
        "NVMLError": FakeNvmlError,
        "NVML_ERROR_LIBRARY_NOT_FOUND": LIBRARY_NOT_FOUND,
        "NVML_ERROR_DRIVER_NOT_LOADED": 9,
        "NVML_TEMPERATURE_GPU": 0,
    }

    def call(name: str, value: Callable[[int], object]) -> Callable[..., object]:
        def read(handle: int, *_: object) -> object:
            if name in unsupported or handle == GPU_LOST:
                raise FakeNvmlError(NOT_SUPPORTED)
            return value(handle)

        return read

    def init() -> None:
        if init_error is not None:
            raise FakeNvmlError(init_error)

    attrs.update(
        nvmlInit=init,
        nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=call("uuid", lambda i: f"GPU-{i}{i}{i}-fake"),
        nvmlDeviceGetName=call("name", lambda i: b"Fake H200"),  # old bindings: bytes
        nvmlDeviceGetUtilizationRates=call("util", lambda i: types.SimpleNamespace(gpu=i * 10)),
        nvmlDeviceGetMemoryInfo=call(
            "memory", lambda i: types.SimpleNamespace(used=i * GIB, total=141 * GIB)
        ),
        nvmlDeviceGetTemperature=call("temp", lambda i: 40 + i),
        nvmlDeviceGetPowerUsage=call("power", lambda i: 100_000 + i * 1000),  # milliwatts
        nvmlDeviceGetEnforcedPowerLimit=call("limit", lambda i: 700_000),
    )
    for name, value in attrs.items():
        setattr(nvml, name, value)
    return nvml


def test_the_real_reader_never_raises_and_says_why_when_no_gpu() -> None:
    status = NvmlReader().read()
    if status.available:  # a GPU machine
        assert status.gpus and not status.reason
    else:
        assert status.reason and not status.gpus
        assert "Traceback" not in status.reason
    assert read_gpus().available == status.available


def test_reads_every_field_in_base_units() -> None:
    status = NvmlReader(fake_nvml(2)).read()
    assert status.available and status.reason == ""
    assert status.gpus[1] == GpuStats(
        index=1,
        name="Fake H200",
        uuid="GPU-111-fake",
        utilization_pct=10.0,
        memory_used_bytes=GIB,
        memory_total_bytes=141 * GIB,
        temperature_c=41.0,
        power_w=101.0,
        power_limit_w=700.0,
    )


def test_a_field_the_gpu_does_not_support_reads_none() -> None:
    status = NvmlReader(fake_nvml(1, unsupported=frozenset({"power", "limit"}))).read()
    gpu = status.gpus[0]
    assert (gpu.power_w, gpu.power_limit_w) == (None, None)
    assert gpu.memory_total_bytes == 141 * GIB


@pytest.mark.parametrize(
    ("visible", "indexes"),
    [
        (None, [0, 1, 2]),
        ("2", [2]),
        ("2,0", [2, 0]),
        ("GPU-111", [1]),  # a UUID prefix, as CUDA accepts
        ("1,bogus,2", [1]),  # CUDA stops at the first entry it cannot read
        ("7,1", [1]),  # an index NVML does not have is skipped
    ],
)
def test_only_the_gpus_cuda_visible_devices_lets_this_process_use(
    visible: str | None, indexes: list[int]
) -> None:
    status = NvmlReader(fake_nvml(3), visible=visible).read()
    assert [g.index for g in status.gpus] == indexes
    assert status.cuda_visible_devices == visible


@pytest.mark.parametrize(
    ("nvml", "visible", "said"),
    [
        (fake_nvml(init_error=LIBRARY_NOT_FOUND), None, "NVML library not found"),
        (fake_nvml(init_error=9), None, "driver is not loaded"),
        (fake_nvml(0), None, "NVML found no usable GPU (0 device(s)"),
        (fake_nvml(3), "-1", "CUDA_VISIBLE_DEVICES='-1' names none of the 3 GPU(s)"),
        (fake_nvml(3), "", "CUDA_VISIBLE_DEVICES='' names none"),
    ],
)
def test_no_gpu_is_a_reason_not_an_exception(
    nvml: types.ModuleType, visible: str | None, said: str
) -> None:
    status = NvmlReader(nvml, visible=visible).read()
    assert not status.available and not status.gpus
    assert said in status.reason
    assert status.as_info() == {
        "available": False,
        "reason": status.reason,
        "cuda_visible_devices": visible,
        "devices": [],
    }


def test_a_lost_gpu_is_left_out_and_the_others_still_read() -> None:
    status = NvmlReader(fake_nvml(GPU_LOST + 1), visible=f"{GPU_LOST},3").read()
    assert [g.index for g in status.gpus] == [3]


def test_without_nvidia_ml_py_the_reason_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    status = NvmlReader().read()
    assert not status.available
    assert "nvidia-ml-py is not installed" in status.reason
    assert "framerelay[gpu]" in status.reason


def test_visible_entries() -> None:
    assert visible_entries(None) is None
    assert visible_entries(" 0, 1 ") == ["0", "1"]
    assert visible_entries("-1") == []


def test_gpu_series_on_metrics_pass_promtool() -> None:
    status = NvmlReader(fake_nvml(2, unsupported=frozenset({"limit"}))).read()
    text = WorkerMetrics(gpus=lambda: status).render().decode()
    labels = '{gpu="1",name="Fake H200",uuid="GPU-111-fake"}'
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    for name, expected in (
        ("utilization_ratio", 0.1),
        ("memory_used_bytes", GIB),
        ("memory_total_bytes", 141 * GIB),
        ("temperature_celsius", 41),
        ("power_watts", 101),
    ):
        assert float(values[f"framerelay_worker_gpu_{name}{labels}"]) == expected, name
    assert "power_limit_watts" not in text  # unsupported everywhere: no series at all
    assert len(list(text_string_to_metric_families(text))) > 5  # parses back
    if shutil.which("promtool"):  # CI has it (tests/metrics fail without); a GPU box may not
        assert promtool(text) == (0, "")


def test_memory_used_is_read_as_nvidia_smi_shows_it() -> None:
    """Memory info v2 (used without the driver's reservation) where the bindings have it."""
    nvml = fake_nvml(2)
    v1 = nvml.nvmlDeviceGetMemoryInfo

    def v2(handle: int, version: int | None = None) -> object:
        if version is None:
            return v1(handle)
        assert version == nvml.nvmlMemory_v2
        return types.SimpleNamespace(used=handle * GIB - 1, total=141 * GIB)

    nvml.nvmlMemory_v2 = 0x02000028  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMemoryInfo = v2  # type: ignore[attr-defined]
    assert NvmlReader(nvml).read().gpus[1].memory_used_bytes == GIB - 1


def test_no_gpu_no_gpu_series() -> None:
    status = GpuStatus(False, "NVML library not found")
    text = WorkerMetrics(gpus=lambda: status).render().decode()
    assert "framerelay_worker_gpu_" not in text
    assert "framerelay_worker_ready" in text


def test_readings_are_taken_at_each_scrape() -> None:
    readings = iter([50.0, 75.0])

    def read() -> GpuStatus:
        return GpuStatus(True, "", [GpuStats(0, "g", "GPU-0", utilization_pct=next(readings))])

    metrics = WorkerMetrics(gpus=read)
    first, second = metrics.render().decode(), metrics.render().decode()
    assert 'framerelay_worker_gpu_utilization_ratio{gpu="0",name="g",uuid="GPU-0"} 0.5' in first
    assert 'framerelay_worker_gpu_utilization_ratio{gpu="0",name="g",uuid="GPU-0"} 0.75' in second


@pytest.mark.gpu
def test_real_nvml_values_on_a_gpu_machine() -> None:
    status = read_gpus()
    if not status.available:
        pytest.skip(f"no GPU here: {status.reason}")
    for gpu in status.gpus:
        assert gpu.uuid.startswith("GPU-") and gpu.name
        assert gpu.memory_total_bytes is not None and gpu.memory_total_bytes > GIB
        assert gpu.memory_used_bytes is not None
        assert 0 <= gpu.memory_used_bytes <= gpu.memory_total_bytes
        assert gpu.utilization_pct is not None and 0 <= gpu.utilization_pct <= 100
        assert gpu.temperature_c is not None and 0 < gpu.temperature_c < 120
        if gpu.power_w is not None:  # some boards do not report power
            assert 0 < gpu.power_w < 2000
    text = WorkerMetrics().render().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    total = families["framerelay_worker_gpu_memory_total_bytes"].samples
    assert [s.labels["gpu"] for s in total] == [str(g.index) for g in status.gpus]
    if shutil.which("promtool"):  # a bare GPU machine may lack it; rendering is checked above
        assert promtool(text) == (0, "")
