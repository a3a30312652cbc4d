"""Prometheus metrics of one worker (a private registry per worker instance).

Durations are in seconds (``framerelay_worker_stage_seconds{stage}``); the
pipeline measures milliseconds and records them through
:attr:`WorkerMetrics.stage_ms`, which converts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpu_worker.gpu_stats import GpuStats, GpuStatus, read_gpus

_STAGE_BUCKETS = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip


class _Observer:
    """One stage's series, fed milliseconds."""

    def __init__(self, series: Histogram) -> None:
        self._series = series

    def observe(self, ms: float) -> None:
        self._series.observe(ms / 1000)


class MsHistogram:
    """``stage_ms.labels(stage).observe(ms)`` into a histogram in seconds."""

    def __init__(self, seconds: Histogram) -> None:
        self.seconds = seconds

    def labels(self, *values: str) -> _Observer:
        return _Observer(self.seconds.labels(*values))


_GPU_LABELS = ("gpu", "uuid", "name")
_GPU_SERIES: tuple[tuple[str, str, Callable[[GpuStats], float | None]], ...] = (
    ("utilization_ratio", "GPU busy share over NVML's last sample period (0..1)",
     lambda g: None if g.utilization_pct is None else g.utilization_pct / 100),
    ("memory_used_bytes", "GPU memory in use (every process)", lambda g: g.memory_used_bytes),
    ("memory_total_bytes", "GPU memory in all", lambda g: g.memory_total_bytes),
    ("temperature_celsius", "GPU core temperature", lambda g: g.temperature_c),
    ("power_watts", "GPU power draw", lambda g: g.power_w),
    ("power_limit_watts", "GPU enforced power limit", lambda g: g.power_limit_w),
)  # fmt: skip


class GpuCollector(Collector):
    """``framerelay_worker_gpu_*{gpu,uuid,name}``, read from NVML at each scrape.

    No series at all where no GPU is visible (``/info`` says why); a field a GPU
    does not report has no sample.
    """

    def __init__(self, read: Callable[[], GpuStatus] = read_gpus) -> None:
        self._read = read

    def describe(self) -> Iterable[Metric]:
        return []  # names are only known to be present at a scrape

    def collect(self) -> Iterator[Metric]:
        status = self._read()
        if not status.available:
            return
        for suffix, doc, value_of in _GPU_SERIES:
            family = GaugeMetricFamily(f"framerelay_worker_gpu_{suffix}", doc, labels=_GPU_LABELS)
            for gpu in status.gpus:
                value = value_of(gpu)
                if value is not None:
                    family.add_metric([str(gpu.index), gpu.uuid, gpu.name], float(value))
            if family.samples:
                yield family


class ModelCollector(Collector):
    """``framerelay_worker_model_*{model}`` and the eviction count, from the model pool's
    ``info()`` at each scrape (:mod:`gpu_worker.model_pool`)."""

    def __init__(self, read: Callable[[], Mapping[str, object]]) -> None:
        self._read = read

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        info = self._read()
        models = info.get("models")
        rows = [m for m in models if isinstance(m, dict)] if isinstance(models, list) else []
        for name, doc, key, scale in _MODEL_SERIES:
            family = GaugeMetricFamily(f"framerelay_worker_model_{name}", doc, labels=["model"])
            for m in rows:
                family.add_metric([str(m["name"])], float(m[key]) * scale)
            yield family
        evictions = info.get("model_evictions", 0)
        yield CounterMetricFamily(
            "framerelay_worker_model_evictions",
            "Models evicted (least recently used, no streams) to make room for another",
            value=float(evictions) if isinstance(evictions, int) else 0.0,
        )


_MODEL_SERIES = (
    ("loaded", "1 when the model is loaded, 0 while held but not loaded yet", "loaded", 1.0),
    ("streams", "Open streams on the model", "streams", 1.0),
    ("vram_bytes", "GPU memory the registry says the model needs", "vram_mb", 2.0**20),
    ("load_seconds", "How long the model's last load took", "load_s", 1.0),
)


class WorkerMetrics:
    def __init__(self, gpus: Callable[[], GpuStatus] = read_gpus) -> None:
        self.registry = CollectorRegistry()
        self._traffic(self.registry)
        self._health(self.registry)
        self._faults(self.registry)
        self.registry.register(GpuCollector(gpus))

    def _traffic(self, r: CollectorRegistry) -> None:
        """Frames, stages, batches, tunnels and sessions."""
        self.frames = Counter(
            "framerelay_worker_frames", "Frames received, by outcome", ["outcome"], registry=r
        )
        self.drops = Counter(
            "framerelay_worker_drops", "Frames not processed, by reason", ["reason"], registry=r
        )
        self.stage_seconds = Histogram(
            "framerelay_worker_stage_seconds",
            "Per-stage latency (decode, queue, infer, track)",
            ["stage"],
            buckets=_STAGE_BUCKETS,
            registry=r,
        )
        self.stage_ms = MsHistogram(self.stage_seconds)
        self.batch_size = Histogram(
            "framerelay_worker_batch_size",
            "Frames per inference batch",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.connections = Gauge("framerelay_worker_connections", "Open tunnels", registry=r)
        self.tunnels = Counter(
            "framerelay_worker_tunnels", "Tunnels accepted (token checked, upgraded)", registry=r
        )
        self.streams = Gauge("framerelay_worker_streams", "Open stream sessions", registry=r)
        self.queue_depth = Gauge("framerelay_worker_queue_depth", "Frames waiting", registry=r)
        self.resumed = Counter(
            "framerelay_worker_sessions_resumed", "Sessions resumed from a snapshot", registry=r
        )

    def _health(self, r: CollectorRegistry) -> None:
        """Readiness and the inference loop's watchdog."""
        self.ready = Gauge(
            "framerelay_worker_ready", "1 after warm-up while inference runs", registry=r
        )
        self.inference_stalled = Gauge(
            "framerelay_worker_inference_stalled",
            "1 while the inference loop is stalled (a batch over inference_stall_s) or ended",
            registry=r,
        )
        self.inference_busy_s = Gauge(
            "framerelay_worker_inference_busy_seconds",
            "How long the batch now in inference has run (0 when idle)",
            registry=r,
        )
        self.provider_info = Gauge(
            "framerelay_worker_provider_info",
            "1 for each execution provider the detector's session really uses",
            ["provider"],
            registry=r,
        )
        self.detector_info = Gauge(
            "framerelay_worker_detector_info",
            "1, labelled with whether TensorRT FP16 and IO binding are really on",
            ["fp16", "io_binding"],
            registry=r,
        )

    def _faults(self, r: CollectorRegistry) -> None:
        """What the loop caught and what the worker refused or closed."""
        self.batch_errors = Counter(
            "framerelay_worker_batch_errors",
            "Failures caught by the inference loop, by stage (infer: a batch, track: a frame)",
            ["stage"],
            registry=r,
        )
        self.paced_s = Counter(
            "framerelay_worker_paced_seconds",
            "Time tunnels were read more slowly for refusing frames too fast",
            registry=r,
        )
        self.tunnels_closed = Counter(
            "framerelay_worker_tunnels_closed",
            "Tunnels the worker closed, by reason (protocol, bad_frames, stalled, slow_peer)",
            ["reason"],
            registry=r,
        )
        self.auth_failures = Counter(
            "framerelay_worker_auth_failures",
            "Refused requests and tunnels (401/403/429), by reason",
            ["reason"],
            registry=r,
        )

    def watch_models(self, read: Callable[[], Mapping[str, object]]) -> None:
        """Report the model pool (``read``: its ``info``) at each scrape."""
        self.registry.register(ModelCollector(read))

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
