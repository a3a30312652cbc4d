"""The orchestrator's values: stream specs, pod intents, pod records.

A *pod* here is one GPU worker rented from a provider (a RunPod pod, a
Kubernetes Pod, or a local process). Its name is derived
from intent - ``<fleet>-<tier>-<slot>-<generation>`` - so a restarted
orchestrator finds the pods it created (or was creating) by name and never
creates a second one for the same intent.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from framerelay.jobs import JobTask
from framerelay.model_registry import MODEL_NAME, ModelName
from framerelay.tracker_times import TrackerTimesConfig
from framerelay.wire import STREAM_ID

Priority = Literal["critical", "standard", "batch"]
PRIORITY_ORDER: dict[str, int] = {"critical": 0, "standard": 1, "batch": 2}
NAME_PART = r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?"
POD_DOMAIN = "pods.framerelay"
"""Pod certificates name ``<pod>.<POD_DOMAIN>``; the ingest verifies that name."""
MAX_GPUS = 8
"""Most GPUs in one pod (RunPod's limit too)."""
_MODEL_NAME = re.compile(MODEL_NAME)
STORED: Mapping[str, object] = MappingProxyType({"stored": True})
"""Validation context of records read back from the store (``model_validate_json(raw,
context=STORED)``): rules tightened since they were written do not stop them loading."""
_POD_NAME = re.compile(r"^(?P<fleet>[a-z0-9]+)-(?P<tier>.+)-(?P<slot>\d+)-g(?P<gen>\d+)$")


class StreamSpec(BaseModel):
    """A stream the operator declared: where it comes from and what it needs. Every
    number is finite and bounded (NaN, Infinity and out-of-range values are a 422)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    id: str = Field(pattern=STREAM_ID)
    url: str = Field(min_length=1, description="Anything the ingest's PyAV opens.")
    priority: Priority = "standard"
    fps: float = Field(5.0, gt=0, le=240, description="Frames per second to analyse.")
    model: str = Field(
        "yolox_nano", max_length=64, json_schema_extra={"pattern": MODEL_NAME},
        description="The model the workers run on this stream: a name of the model registry "
        "(1-64 letters, digits, '.', '_' or '-', starting with a letter or digit); also its "
        "demand weight (model_costs).",
    )  # fmt: skip
    tracker: str = Field("default", max_length=64)
    tracker_settings: TrackerTimesConfig | None = Field(
        None, description="The stream's own tracker time settings, passed to the ingest."
    )
    realtime: bool = True
    loop: bool = False
    latency_slo_ms: float | None = Field(
        None, gt=0, le=600_000,
        description="Latency objective in ms, passed to the ingest (null: none).",
    )  # fmt: skip
    job: JobTask | None = Field(
        None, description="A batch job's task (docs/jobs.md), passed to the ingest: the stream "
        "reads its file once at full speed from its checkpoint (realtime and loop false).",
    )  # fmt: skip

    @model_validator(mode="after")
    def _job_is_read_once(self) -> StreamSpec:
        if self.job is not None and (self.realtime or self.loop):
            raise ValueError("a job task is read once at full speed: realtime and loop false")
        return self

    @field_validator("model")
    @classmethod
    def _model_name(cls, value: str, info: ValidationInfo) -> str:
        """The registry's name rule, except for a stream read back with :data:`STORED` (one
        written before the rule keeps loading, its name as it was)."""
        if _MODEL_NAME.fullmatch(value) or (info.context or {}).get("stored") is True:
            return value
        raise ValueError(
            "a model name is 1-64 letters, digits, '.', '_' or '-', starting with a letter "
            "or digit (a name of the model registry)"
        )


class PodStatus(enum.StrEnum):
    PROVISIONING = "PROVISIONING"
    RUNNING = "RUNNING"
    EXITED = "EXITED"
    TERMINATED = "TERMINATED"
    ERROR = "ERROR"
    """The pod will never serve (RunPod's ERROR, or running with no public address after
    the provider's grace): the fleet terminates and replaces it at once, with its reason."""
    NO_CAPACITY = "NO_CAPACITY"
    """No node can take the pod (Kubernetes: unschedulable for longer than the provider's
    grace): the fleet deletes it and treats the tier as on a "no capacity" answer to a
    create (held; its demand goes to the next allowed tier)."""


@dataclass(frozen=True, slots=True)
class PodSpec:
    """What to create. ``secret_env`` values never print (SecretStr)."""

    name: str
    tier: str
    gpu_types: tuple[str, ...]
    spot: bool
    image: str = ""
    cloud_types: tuple[str, ...] = ("SECURE",)
    data_centers: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    secret_env: dict[str, SecretStr] = field(default_factory=dict)
    tls_server_name: str | None = None
    """The name in the pod's certificate (``<pod>.pods.framerelay``); None without TLS."""
    port: int = 8443
    """The first worker's port; worker ``k`` of a multi-GPU pod listens on ``port + k``."""
    gpu_count: int = 1
    container_disk_gb: int = 20
    network_volume_id: str | None = None
    template_id: str | None = None
    """Create the pod from this provider template (RunPod): the template supplies the image,
    its disk and shared env; the pod gets its own env, GPUs and ports."""
    min_vram_gb: float = 0.0
    """VRAM one GPU needs for the tier's models (sizing); a GPU type with less is not rented."""
    gpu_fps: Mapping[str, float] = field(default_factory=dict)
    """Reference-model fps one GPU of each type promises for the tier's models (sizing),
    where measured: the provider ranks those types by price per fps, the rest by price."""

    @property
    def ports(self) -> list[int]:
        """One port per worker (GPU)."""
        return [self.port + k for k in range(self.gpu_count)]

    @property
    def worker_args(self) -> list[str]:
        """The ``framerelay`` command of the pod: one worker, or one per GPU."""
        return ["worker"] if self.gpu_count == 1 else ["worker", "--gpus", str(self.gpu_count)]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where one worker of a pod answers: its tunnel and its HTTP base URL."""

    tunnel_url: str
    http_url: str


@dataclass(slots=True)
class PodInfo:
    """What a provider says about one pod."""

    id: str
    name: str
    status: PodStatus
    cost_per_hr: float = 0.0
    gpu_type: str = ""
    spot: bool = False
    cloud_type: str = ""
    tunnel_url: str | None = None
    http_url: str | None = None
    tls_server_name: str | None = None
    endpoints: tuple[Endpoint, ...] = ()
    """One per worker (GPU) of the pod, in GPU order; the first is also ``tunnel_url`` /
    ``http_url``. Empty while the pod has no address yet."""
    data_center: str = ""
    reason: str | None = None
    """Why the provider says what it says (one line), e.g. why a pod is in ERROR."""

    def set_endpoints(self, endpoints: tuple[Endpoint, ...]) -> None:
        self.endpoints = endpoints
        if endpoints:
            self.tunnel_url, self.http_url = endpoints[0].tunnel_url, endpoints[0].http_url


def worker_name(pod: str, index: int, count: int) -> str:
    """The id of a pod's ``index``-th worker: the pod's name when it has one GPU, else
    ``<pod>-gpu<index>`` (as ``framerelay worker --gpus N`` names them)."""
    return pod if count == 1 else f"{pod}-gpu{index}"


MAX_WORKER_MODELS = 64
"""Models of one worker's ``/info`` kept in its state, at most."""


class WorkerModels(BaseModel):
    """A worker's models as its ``/info`` says (issue 17): what placement needs."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    budget_mb: float = Field(ge=0, le=1e7, description="Its model memory budget; 0: none.")
    loaded: dict[ModelName, Annotated[float, Field(ge=0, le=1e7)]] = Field(
        default_factory=dict, description="Models loaded (or pinned) -> their memory (MiB)."
    )
    pinned: tuple[ModelName, ...] = Field((), description="Models it never evicts.")
    default: ModelName | None = Field(None, description="The model of streams naming none.")
    load_s: dict[ModelName, Annotated[float, Field(ge=0, le=86_400)]] = Field(
        default_factory=dict, description="How long each loaded model took to load."
    )

    @classmethod
    def from_info(cls, info: Mapping[str, object]) -> WorkerModels | None:
        """Read from ``/info`` tolerantly: None for a worker from before models (or an
        implausible budget); entries that are not plausible are skipped."""
        budget, models = info.get("vram_budget_mb"), info.get("models")
        if not _plausible(budget, 1e7) or not isinstance(models, list):
            return None
        held = [h for h in map(_held, models[:MAX_WORKER_MODELS]) if h is not None]
        default = info.get("default_model")
        named = default if isinstance(default, str) and _MODEL_NAME.fullmatch(default) else None
        return cls(
            budget_mb=float(budget),  # type: ignore[arg-type] # checked by _plausible
            loaded={name: mb for name, mb, _, _ in held},
            pinned=tuple(name for name, _, pinned, _ in held if pinned),
            default=named,
            load_s={name: s for name, _, _, s in held if s is not None},
        )


def _held(entry: object) -> tuple[str, float, bool, float | None] | None:
    """(name, MiB, pinned, load seconds) of a model ``/info`` lists as loaded or pinned."""
    if not isinstance(entry, dict):
        return None
    name, mb, pinned = entry.get("name"), entry.get("vram_mb"), entry.get("pinned") is True
    if not isinstance(name, str) or not _MODEL_NAME.fullmatch(name) or not _plausible(mb, 1e7):
        return None
    if not (pinned or entry.get("loaded") is True):
        return None
    load_s = entry.get("load_s")
    return name, float(mb), pinned, float(load_s) if _plausible(load_s, 86_400) else None  # type: ignore[arg-type]


def _plausible(value: object, most: float) -> bool:
    """A finite number (not a bool) in [0, most]."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value <= most
    )


class WorkerState(BaseModel):
    """One worker as the orchestrator sees it: where it answers and how healthy it is.

    A one-GPU pod is its own worker (:class:`PodRecord` is a ``WorkerState``); a pod of
    ``gpu_count`` > 1 holds one per GPU in :attr:`PodRecord.gpus`.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str
    tunnel_url: str | None = None
    http_url: str | None = None
    tls_server_name: str | None = Field(None, description="Name to verify the pod's TLS with.")
    ready: bool = False
    ready_since: float | None = None
    capacity_fps: float = 0.0
    fails: int = 0
    last_ok: float | None = None
    last_canary: float | None = None
    canary_ms: float | None = Field(None, description="Round trip of the last passed canary.")
    last_error: str | None = Field(None, max_length=500)
    models: WorkerModels | None = Field(
        None,
        description="Its models, budget and default as its last /info said (issue 17); None: "
        "unknown (a worker from before models, or not probed yet). Records written before "
        "this field load as unknown.",
    )
    rtt_ms: float | None = Field(
        None, ge=0, le=600_000,
        description="Round trip from the ingest, ms: the median of its recent measurements "
        "(WebSocket pings on a tunnel, deploy.latency); None: not measured.",
    )  # fmt: skip
    processing_ms: float | None = Field(
        None, ge=0, le=600_000,
        description="Its processing time of a frame, ms: the median of the ingest's recent "
        "measurements (probe frames, less the round trip; deploy.latency), until then its "
        "/info ms_per_inference; None: unknown.",
    )  # fmt: skip


class PodRecord(WorkerState):
    """The orchestrator's record of one pod (kept in Redis)."""

    tier: str
    slot: int = Field(ge=0)
    gen: int = Field(ge=0)
    spot: bool
    state: Literal["creating", "running", "draining", "gone"] = "creating"
    provider_id: str | None = None
    created_at: float = 0.0
    cost_per_hr: float = 0.0
    ondemand_per_hr: float = 0.0
    gpu_type: str = ""
    draining_since: float | None = None
    provider_reason: str | None = Field(
        None,
        max_length=500,
        description="What the provider says of the pod while it is not simply serving, one "
        "line (Kubernetes: 'Unschedulable: 0/3 nodes are available: ...', 'ErrImagePull: "
        "...', 'not Ready: ...'); None: nothing to say.",
    )
    create_failures: int = Field(0, ge=0)
    retry_at: float | None = None
    gpu_count: int = Field(1, ge=1, le=MAX_GPUS)
    gpus: list[WorkerState] = Field(
        default_factory=list,
        description="One worker per GPU when gpu_count > 1 (the pod's own health fields then "
        "sum them up: ready when all are, capacity their sum).",
    )

    def workers(self) -> list[WorkerState]:
        """The pod's workers: itself (one GPU) or one per GPU."""
        if self.gpu_count == 1:
            return [self]
        if len(self.gpus) != self.gpu_count:
            self.gpus = [
                WorkerState(name=worker_name(self.name, i, self.gpu_count))
                for i in range(self.gpu_count)
            ]
        return list(self.gpus)

    def set_endpoint(self, info: PodInfo) -> None:
        """Where the pod's workers answer, as its provider says (and the name its TLS has)."""
        self.tunnel_url, self.http_url = info.tunnel_url, info.http_url
        self.tls_server_name = info.tls_server_name
        if self.gpu_count == 1:
            return
        for i, worker in enumerate(self.workers()):
            there = info.endpoints[i] if i < len(info.endpoints) else None
            worker.tunnel_url = there.tunnel_url if there else None
            worker.http_url = there.http_url if there else None
            worker.tls_server_name = info.tls_server_name

    def sum_up(self) -> None:
        """A multi-GPU pod's own health from its workers': ready when every one is."""
        if self.gpu_count == 1:
            return
        workers = self.workers()
        self.ready = all(w.ready for w in workers)
        self.capacity_fps = sum(w.capacity_fps for w in workers)
        self.fails = max(w.fails for w in workers)
        since = [w.ready_since for w in workers if w.ready_since is not None]
        self.ready_since = max(since) if self.ready and since else None
        errors = [f"{w.name}: {w.last_error}" for w in workers if w.last_error]
        self.last_error = "; ".join(errors)[:500] or None


def tls_server_name(pod: str) -> str:
    """The DNS name in a pod's certificate (verified by the ingest and the canary)."""
    return f"{pod}.{POD_DOMAIN}"


def pod_name(fleet: str, tier: str, slot: int, gen: int) -> str:
    return f"{fleet}-{tier}-{slot}-g{gen}"


def parse_pod_name(fleet: str, name: str) -> tuple[str, int, int] | None:
    """(tier, slot, gen) of a name this fleet made, else None."""
    m = _POD_NAME.match(name)
    if m is None or m["fleet"] != fleet:
        return None
    return m["tier"], int(m["slot"]), int(m["gen"])


def check_name_part(kind: str, value: str) -> str:
    if not re.fullmatch(NAME_PART, value):
        raise ValueError(
            f"{kind} {value!r} must be 1-32 lowercase letters, digits or '-' "
            "(it becomes part of pod and Kubernetes object names)"
        )
    return value
