"""Orchestrator settings (env prefix ``FRAMERELAY_ORCH_``, nested with ``__``).

Tiers and their schedules are usually given as JSON, e.g.
``FRAMERELAY_ORCH_TIERS='[{"name": "ondemand", "spot": false, ...}]'``.
Secrets (the RunPod API key, the signing keys) are ``SecretStr`` and each
also reads ``<NAME>_FILE`` (:class:`framerelay.settings.ServiceSettings`).
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    IPvAnyNetwork,
    PrivateAttr,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import SettingsConfigDict

from deploy.job_inputs import JobsSettings
from deploy.models import MAX_GPUS, check_name_part
from deploy.providers.kubernetes.profiles import SPOT_PROFILES, SchedulingProfile, profile_for
from framerelay import __version__
from framerelay.listeners import ListenerSettings
from framerelay.net import plain_http_problem
from framerelay.settings import DEFAULT_MODEL, ServiceSettings, redis_url_problem
from framerelay.web_limits import DEFAULT_MAX_BODY_BYTES

CloudType = Literal["SECURE", "COMMUNITY"]

log = logging.getLogger(__name__)


class Window(BaseModel):
    """A time window in which a tier keeps at least ``min_warm`` workers."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    days: tuple[int, ...] = Field((0, 1, 2, 3, 4), description="Weekdays, 0 = Monday.")
    start: dt.time = Field(dt.time(7, 0), description="Local start time (HH:MM).")
    end: dt.time = Field(dt.time(19, 0), description="Local end time; before start = overnight.")
    min_warm: int = Field(1, ge=0, le=1000)

    @field_validator("days")
    @classmethod
    def _days(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or any(d < 0 or d > 6 for d in v):
            raise ValueError("days are weekday numbers 0 (Monday) .. 6 (Sunday)")
        return v


def renamed(data: Any, old: str, new: str, what: str) -> Any:
    """``data`` with a setting's old name read as its new one, saying so once per load
    (the old name is read until the next release)."""
    if not isinstance(data, dict) or old not in data:
        return data
    if new in data:
        raise ValueError(f"give {new!r} alone: {old!r} is its old name")
    out = {k: v for k, v in data.items() if k != old}
    out[new] = data[old]
    name = data.get("name")
    where = f"{what} {name}" if isinstance(name, str) else what
    log.warning(
        "%s: %r is renamed %r; the old name is read until the next release", where, old, new
    )
    return out


class GpuTypeConfig(BaseModel):
    """What sizing knows of one GPU type: its VRAM, measured capacity, list price."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    vram_gb: float = Field(gt=0, le=4096, description="Memory of one GPU.")
    capacity_fps: dict[str, Annotated[float, Field(gt=0, le=1_000_000)]] = Field(
        default_factory=dict,
        description="Measured fps of each model on one GPU of this type (e.g. bench/gpu.py).",
    )
    usd_per_hr: float | None = Field(
        None,
        ge=0,
        le=1e6,
        description="List price of one GPU on demand, until the provider reports one.",
    )
    interruptible_usd_per_hr: float | None = Field(
        None, ge=0, le=1e6, description="...on interruptible capacity (Kubernetes spot nodes)."
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        return renamed(data, "spot_usd_per_hr", "interruptible_usd_per_hr", "GPU catalog entry")


VOLUME_CACHE = "framerelay/cache"
"""The workers' artefact cache (built models, TensorRT engines), under the volume's mount."""
_CACHE_ENV = "FRAMERELAY_WORKER_DETECTOR__CACHE_DIR"
_ENGINE_ENV = "FRAMERELAY_WORKER_DETECTOR__ENGINE_CACHE_DIR"
VOLUME_ENV = "FRAMERELAY_WORKER_VOLUME_DIR"
"""Tells a worker where its shared volume is: what it reads there must be signed."""


class TierVolume(BaseModel):
    """A volume every pod of the tier mounts: model files and the artefact cache
    (TensorRT engines, built models), so a second pod of a GPU type starts without
    building. Give the field of the provider in use."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runpod_id: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="RunPod network volume id (networkVolumeId).",
    )
    data_center: str | None = Field(
        None,
        min_length=1,
        max_length=40,
        pattern=r"^[A-Za-z0-9-]+$",
        description="The RunPod volume's data centre: a network volume lives in one, and "
        "pods that mount it run there (the tier's data_centers must include it).",
    )
    claim: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="Kubernetes PersistentVolumeClaim (ReadWriteMany for several pods).",
    )
    local_dir: Path | None = Field(None, description="local provider: a shared directory.")
    mount_path: str = Field(
        "/workspace",
        pattern=r"^/[A-Za-z0-9._/-]*$",
        max_length=200,
        description="Where pods see the volume (RunPod's volumeMountPath; a PVC's mountPath).",
    )

    def cache_dir(self, root: str | Path) -> str:
        return f"{str(root).rstrip('/')}/{VOLUME_CACHE}"

    def worker_env(self, root: str | Path) -> dict[str, str]:
        """The worker's artefact cache and TensorRT engine cache on the volume (``root``:
        where the pod sees it); the engine cache is named too, since the CUDA image sets
        one of its own (a local directory). ``VOLUME_DIR`` makes the worker take files
        from the volume only as its signed manifest lists them (any pod can write it)."""
        cache = self.cache_dir(root)
        return {_CACHE_ENV: cache, _ENGINE_ENV: f"{cache}/trt", VOLUME_ENV: str(root)}


FlashBoot = Literal["OFF", "FLASHBOOT", "PRIORITY_FLASHBOOT"]


class ServerlessConfig(BaseModel):
    """A RunPod serverless endpoint the orchestrator manages for a tier (``<fleet>-<tier>``,
    queue-based, workers from 0 to the tier's ``max_workers``, on its ``gpu_types``,
    ``data_centers`` and network volume): what only an endpoint has."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    idle_timeout_s: int = Field(
        5, ge=1, le=3600, description="Seconds an idle worker waits for a job before it stops."
    )
    flashboot: FlashBoot = Field(
        "FLASHBOOT",
        description="RunPod's cold-start acceleration: OFF, FLASHBOOT or PRIORITY_FLASHBOOT.",
    )
    queue_delay_s: float = Field(
        4.0,
        ge=0.5,
        le=3600,
        description="Scaling: another worker starts when a job has "
        "waited this long in the queue (RunPod's QUEUE_DELAY scaler).",
    )
    execution_timeout_s: int = Field(
        600, ge=5, le=86_400, description="The endpoint's timeout of one job's execution."
    )


class TierConfig(BaseModel):
    """A pool of like GPU workers: what to rent, how many, when."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(description="Lowercase id, part of pod names.")
    interruptible: bool = Field(
        False,
        description="Capacity the provider may take back at any time (Kubernetes spot node "
        "pools; the local provider plays it); never takes critical streams. RunPod has none "
        'since 2026-05: its cheaper capacity is cloud_types ["COMMUNITY"] or a serverless '
        "tier. (Read from the old name 'spot' too, with a warning, until the next release.)",
    )
    gpu_types: tuple[str, ...] = Field(
        ("NVIDIA RTX A4000",), min_length=1, description="In order of preference."
    )
    cloud_types: tuple[CloudType, ...] = Field(("SECURE",), min_length=1)
    data_centers: tuple[str, ...] = Field((), description="Allowed data centres, in order.")
    region: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="The region its data centres are in (e.g. eu-central): placement prefers "
        "the region with the lowest measured round trip to the ingest (deploy.latency); "
        "None: each worker counts as a region of its own.",
    )
    min_warm: int = Field(0, ge=0, le=1000, description="Warm pods outside any window.")
    max_workers: int = Field(4, ge=0, le=1000, description="Most pods of the tier at once.")
    gpu_count: int = Field(
        1,
        ge=1,
        le=MAX_GPUS,
        description="GPUs per pod; the pod runs one worker per GPU ('framerelay worker --gpus "
        "N'), each placed and health-checked on its own.",
    )
    models: tuple[str, ...] = Field(
        (),
        description="Models the tier must host: its GPU types are then ranked by price per "
        "unit of measured capacity for them, within their VRAM (gpu_catalog).",
    )
    template_id: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="RunPod template to create the tier's pods from (it supplies the image, "
        "its disk and shared env; see docs/deploy.md).",
    )
    volume: TierVolume | None = Field(
        None,
        description="A network volume (RunPod) / PVC (Kubernetes) / shared directory "
        "(local) for model files and the workers' artefact and engine caches.",
    )
    windows: tuple[Window, ...] = ()
    lead_s: float = Field(
        900.0, ge=0, le=86_400, description="Scale up this long before a window opens."
    )
    batch_only: bool = Field(False, description="Only batch streams; zero outside windows.")
    capacity_fps: float = Field(
        0.0,
        ge=0,
        le=1_000_000,
        description="Capacity per worker (one GPU) in fps of the reference model; 0 = measured "
        "by each worker's warm-up benchmark (GET /info).",
    )
    serverless_endpoint_id: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="A RunPod serverless endpoint (queue-based, running the worker image's "
        "handler: docs/runpod.md#serverless-mode): job tasks on this tier go to its /run API, "
        "no pod is rented; the API key is the RunPod one (runpod.api_key).",
    )
    serverless: ServerlessConfig | None = Field(
        None,
        description="A RunPod serverless endpoint the orchestrator creates and keeps "
        "as the tier says (docs/runpod.md#serverless-mode): job tasks go to it, no pod is "
        "rented; instead of a hand-made serverless_endpoint_id.",
    )
    serverless_price_per_s: float = Field(
        0.0,
        ge=0,
        le=1,
        description="On a serverless tier: the endpoint's price ($) "
        "a second of worker execution (RunPod bills executionTime), for jobs' cost.",
    )

    @property
    def takes_critical(self) -> bool:
        """Whether critical streams may run on this tier's workers: only on capacity that
        is neither interruptible nor possibly a community-cloud host (those fail more
        often): ``cloud_types`` must be the secure cloud alone."""
        return not self.interruptible and set(self.cloud_types) == {"SECURE"}

    @property
    def rents_pods(self) -> bool:
        """False for a serverless tier: the scaler and placement leave it alone."""
        return self.serverless_endpoint_id is None and self.serverless is None

    @model_validator(mode="after")
    def _one_endpoint(self) -> TierConfig:
        if self.serverless is not None and self.serverless_endpoint_id is not None:
            raise ValueError(
                f"tier {self.name}: give serverless (an endpoint the orchestrator manages) "
                "or serverless_endpoint_id (a hand-made one), not both"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        return renamed(data, "spot", "interruptible", "tier")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name_part("tier name", v)


WORKER_IMAGE = f"framerelay/worker:{__version__}"
"""The CUDA worker image (deploy/docker/worker-cuda.Dockerfile, ``make images``); the
same name in compose and deploy/k8s. The CPU worker is ``framerelay/worker:<version>-cpu``."""


def default_tiers() -> list[TierConfig]:
    return [
        TierConfig(name="ondemand", min_warm=1, max_workers=4),
        TierConfig(name="community", cloud_types=("COMMUNITY", "SECURE"), max_workers=8),
    ]


class _TierVolumes(BaseModel):
    """The tiers' volumes, shared with a provider's settings by OrchestratorSettings (a
    provider sees a pod's tier name, not the tier)."""

    _volumes: dict[str, TierVolume] = PrivateAttr(default_factory=dict)

    def set_volumes(self, volumes: dict[str, TierVolume]) -> None:
        self._volumes = dict(volumes)

    def volume_for(self, tier: str) -> TierVolume | None:
        return self._volumes.get(tier)


RUNPOD_API = "https://api.runpod.io/v2"
"""RunPod's REST API v2 (v1, ``https://rest.runpod.io/v1``, was retired on 2026-11-15)."""
_CUDA_VERSION = r"^\d+\.\d+$"


class RunPodSettings(_TierVolumes):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    api_key: SecretStr | None = Field(None, description="RunPod API key (Bearer header only).")
    base_url: str = Field(
        RUNPOD_API,
        description="RunPod's REST API v2 (https://; plain http:// to loopback only, for a "
        "test server): the API key goes in every request. A v1 URL is refused.",
    )
    image: str = Field(WORKER_IMAGE, description="Worker image.")
    registry: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="RunPod container registry credential id, for a private worker image "
        "(the create body's registry).",
    )
    min_cuda_version: str | None = Field(
        "12.8",
        pattern=_CUDA_VERSION,
        description="Lowest CUDA version of a pod's host (major.minor; the CUDA worker image "
        "is built on CUDA 12.8): sent as gpu.minCudaVersion and scopes the catalog's stock.",
    )
    allowed_cuda_versions: tuple[Annotated[str, Field(pattern=_CUDA_VERSION)], ...] = Field(
        (),
        description="Exact CUDA versions a host may have, instead of min_cuda_version "
        "(gpu.allowedCudaVersions); empty: use min_cuda_version.",
    )
    catalog_ttl_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="How long the GPU catalog (stock, prices, CUDA versions) is reused "
        "before it is read again.",
    )
    unreachable_grace_s: float = Field(
        90.0,
        gt=0,
        le=3600,
        description="A pod RUNNING this long with no public IP and port for a worker port "
        "(community hosts may have none) is terminated and replaced.",
    )
    avoid_s: float = Field(
        1800.0,
        ge=0,
        le=86_400,
        description="After such a pod, its data centre and cloud are tried last for this long.",
    )
    container_disk_gb: int = Field(20, ge=1, le=2000)
    network_volume_id: str | None = Field(
        None,
        description="Network volume of every pod whose tier names none (a tier's "
        "volume.runpod_id wins); mounted at volume_mount_path.",
    )
    volume_mount_path: str = Field("/workspace", pattern=r"^/[A-Za-z0-9._/-]*$")
    timeout_s: float = Field(30.0, gt=0, le=600)
    max_retries: int = Field(4, ge=0, le=20, description="Retries of 429/5xx per request.")
    backoff_s: float = Field(
        0.5, gt=0, le=600, description="First retry delay; doubles, with jitter."
    )
    tls: bool = Field(
        True, description="Pods serve wss:// with their own certificate from the orchestrator's CA."
    )
    allow_insecure: bool = Field(
        False, description="Allow tls=false (plain ws:// across clouds); logged as a warning."
    )

    @field_validator("base_url")
    @classmethod
    def _https_only(cls, v: str) -> str:
        if not v.startswith(("https://", "http://")):
            raise ValueError(f"base_url must be https://host/v2 (RunPod's is {RUNPOD_API})")
        problem = plain_http_problem(v, "RunPod's API")
        if problem is not None:
            raise ValueError(problem)
        url = urlsplit(v)
        path = url.path.rstrip("/")
        if url.hostname == "rest.runpod.io" or path.endswith("/v1"):
            raise ValueError(
                "RunPod's REST API v1 was retired on 2026-11-15: set "
                f"FRAMERELAY_ORCH_RUNPOD__BASE_URL={RUNPOD_API} (or unset it)"
            )
        if not path.endswith("/v2"):
            raise ValueError(f"base_url must end in /v2, RunPod's REST API v2 ({RUNPOD_API})")
        return v

    @model_validator(mode="after")
    def _cuda(self) -> RunPodSettings:
        if self.allowed_cuda_versions and "min_cuda_version" in self.model_fields_set:
            if self.min_cuda_version is not None:
                raise ValueError(
                    "give min_cuda_version or allowed_cuda_versions, not both (RunPod "
                    "refuses a create with both)"
                )
        return self

    @property
    def cuda(self) -> dict[str, str | list[str]]:
        """The CUDA constraint of a create's ``gpu`` (and of a catalog read): the exact
        versions when given, else the floor, else none."""
        if self.allowed_cuda_versions:
            return {"allowedCudaVersions": list(self.allowed_cuda_versions)}
        return {"minCudaVersion": self.min_cuda_version} if self.min_cuda_version else {}

    def tier_problem(self, tiers: list[TierConfig]) -> str | None:
        """Why these tiers cannot run on RunPod (None: they can). RunPod's API v2 has no
        spot (interruptible) pods: its cheaper capacity is the community cloud."""
        taken = [t.name for t in tiers if t.interruptible and t.rents_pods]
        if not taken:
            return None
        return (
            f"tier {taken[0]}: RunPod has no spot (interruptible) pods: give it "
            '"interruptible": false and "cloud_types": ["COMMUNITY"] (RunPod\'s cheaper '
            "capacity) in FRAMERELAY_ORCH_TIERS"
        )


class LocalSettings(_TierVolumes):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: Path = DEFAULT_MODEL
    threads: int = Field(1, ge=0, le=256)
    ready_timeout_s: float = Field(120.0, gt=0, le=86_400)
    price_per_hr: float = Field(
        0.0, ge=0, le=1e6, description="Nominal $/h of a local on-demand worker."
    )
    spot_price_per_hr: float = Field(
        0.0, ge=0, le=1e6, description="Nominal $/h of a local spot worker."
    )
    tls: bool = Field(False, description="Local workers serve wss:// with a CA certificate too.")


class KubernetesSettings(_TierVolumes):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    namespace: str = "framerelay"
    image: str = WORKER_IMAGE
    secret_name: str = Field(
        "framerelay-worker-env", description="Secret holding any other secret env of worker pods."
    )
    profiles: dict[str, SchedulingProfile] = Field(
        default_factory=dict,
        description="Scheduling profile of each tier's pods, by tier name (JSON): "
        "tolerations, node selectors, GPU resource, CPU and memory per GPU...; a tier with "
        "none gets the ready-made 'gpu' profile (docs/kubernetes.md#scheduling-profiles).",
    )
    peer_cidrs: tuple[IPvAnyNetwork, ...] = Field(
        (),
        description="Networks (CIDR) of an ingest or orchestrator outside the cluster (address "
        "'pod-ip'): each pod's NetworkPolicy admits them to its workers' ports, as it admits "
        "the in-cluster ingest and orchestrator pods.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Deprecated, read with a warning until the next release: a node "
        "selector under every tier's profile; give a tier's profile its node_selector.",
    )
    kubeconfig: Path | None = Field(
        None,
        description="Kubeconfig file of the cluster; unset: in-cluster (the orchestrator's "
        "service account) when run in a pod, else $KUBECONFIG or ~/.kube/config.",
    )
    context: str | None = Field(
        None, min_length=1, description="Context of the kubeconfig (unset: its current one)."
    )
    field_manager: str = Field(
        "framerelay-orchestrator",
        min_length=1,
        max_length=128,
        description="Field manager of the orchestrator's server-side applies (force: it owns "
        "every field it sets).",
    )
    unschedulable_grace_s: float = Field(
        60.0,
        ge=0,
        le=3600,
        description="A pod the scheduler cannot place for this long means no capacity: it is "
        "deleted and the tier's demand goes to the next allowed tier.",
    )
    address: Literal["service", "pod-ip"] = Field(
        "service",
        description="How the orchestrator reaches a pod's workers: 'service', its Service's "
        "DNS name <pod>.<namespace>.svc (the orchestrator runs in the cluster); 'pod-ip', the "
        "pod's status.podIP (an orchestrator that reaches pod IPs directly).",
    )
    tls: bool = Field(True, description="Pods serve wss:// (a kubernetes.io/tls Secret per pod).")
    allow_insecure: bool = Field(False, description="Allow tls=false; logged as a warning.")

    @model_validator(mode="before")
    @classmethod
    def _no_kubectl(cls, data: Any) -> Any:
        if isinstance(data, dict) and "kubectl" in data:
            raise ValueError(
                "kubectl is no longer used: the provider talks to the API server itself; "
                "remove FRAMERELAY_ORCH_KUBERNETES__KUBECTL (set __KUBECONFIG and __CONTEXT "
                "to pick a cluster)"
            )
        return data

    @field_validator("profiles")
    @classmethod
    def _profiles(cls, v: dict[str, SchedulingProfile]) -> dict[str, SchedulingProfile]:
        for tier, profile in v.items():
            try:
                profile.resolved()
            except ValueError as exc:
                raise ValueError(f"the profile of tier {tier}: {exc}") from None
        return v

    @field_validator("node_selector")
    @classmethod
    def _old_selector(cls, v: dict[str, str]) -> dict[str, str]:
        if v:
            log.warning(
                "kubernetes.node_selector is deprecated (read until the next release): give "
                "each tier's profile its node_selector (FRAMERELAY_ORCH_KUBERNETES__PROFILES)"
            )
        return v

    def tier_problem(self, tiers: list[TierConfig]) -> str | None:
        """Why these tiers' profiles cannot be (None: they can): a profile of no tier, an
        interruptible tier off spot nodes, or spot nodes under a tier that takes critical
        streams."""
        names = [t.name for t in tiers]
        unknown = sorted(set(self.profiles) - set(names))
        if unknown:
            return f"kubernetes.profiles: {unknown[0]!r} is no tier (the tiers: {names})"
        for t in (t for t in tiers if t.rents_pods):
            spot = profile_for(self, t.name).selects_spot
            if t.interruptible and not spot:
                return (
                    f"tier {t.name} is interruptible but its Kubernetes profile selects no "
                    f"spot nodes: give it one of the spot profiles ({', '.join(SPOT_PROFILES)}"
                    f'), e.g. FRAMERELAY_ORCH_KUBERNETES__PROFILES=\'{{"{t.name}": '
                    '{"base": "gke-spot"}}\', or "spot_nodes": true on a profile of your own'
                )
            if spot and not t.interruptible:
                return (
                    f"tier {t.name}'s Kubernetes profile selects spot nodes, which the cluster "
                    'takes back at any time: give the tier "interruptible": true (it then takes '
                    "no critical stream) or a profile without spot nodes"
                )
        return None


class OrchestratorSettings(ServiceSettings):
    model_config = SettingsConfigDict(
        env_prefix="FRAMERELAY_ORCH_",
        env_nested_delimiter="__",
        extra="forbid",
        hide_input_in_errors=True,  # a value in the wrong place may be a secret (API key)
    )
    env_also: ClassVar[frozenset[str]] = frozenset(
        {"FRAMERELAY_ORCH_URL", "FRAMERELAY_ORCH_CA_FILE"}
    )
    """Read by the fleet CLI commands (where the orchestrator is, its CA), not by it."""

    host: str = "127.0.0.1"
    port: int = Field(8090, ge=0, le=65535)
    listener: ListenerSettings = Field(
        default_factory=ListenerSettings,
        description="The API listener's limits before authentication: connections, header "
        "and keep-alive timeouts, trusted proxies (framerelay.listeners).",
    )
    redis_url: SecretStr = Field(
        SecretStr("redis://127.0.0.1:6379/0"),
        description="Redis holding the fleet state (checked at start; a secret: it may hold "
        "a password, so FRAMERELAY_ORCH_REDIS_URL_FILE may name a file holding it).",
    )
    key_prefix: str = Field("framerelay:orch:", description="Prefix of every Redis key.")
    provider: Literal["local", "runpod", "kubernetes"] = "local"
    fleet: str = Field("fr", description="Fleet name: prefix of every pod name.")
    tiers: list[TierConfig] = Field(default_factory=default_tiers)
    timezone: str = Field("UTC", description="Time zone of the tiers' windows (IANA name).")
    signing_keys: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("signing_keys", "FRAMERELAY_SIGNING_KEYS"),
        description="Private JWKS ('framerelay keys generate'): verifies API tokens, mints "
        "canary and ingest tokens; pods get only its public half.",
    )
    token_secrets: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("token_secrets", "FRAMERELAY_TOKEN_SECRETS"),
        description="HS256 shared secrets (single host only: local pods get them).",
    )
    token_leeway_s: float = Field(30.0, ge=0, le=3600, description="Clock skew allowed.")
    revoked_tokens_file: Path | None = Field(
        None,
        validation_alias=AliasChoices("revoked_tokens_file", "FRAMERELAY_REVOKED_TOKENS_FILE"),
        description="Revoked tokens, one jti:<id> or sub:<holder> a line (docs/security.md); "
        "read again within a second of a change, and open sessions of a revoked token end.",
    )
    auth_max_failures: int = Field(
        20, ge=1, le=1_000_000, description="Failed authentications per window."
    )
    auth_window_s: float = Field(60.0, gt=0, le=86_400, description="...per peer, before 429.")
    metrics_auth: bool = Field(False, description="/metrics needs scope metrics:read.")
    max_body_bytes: int = Field(
        DEFAULT_MAX_BODY_BYTES, ge=1, le=1 << 30, description="Largest API request body (413)."
    )
    tls_cert: Path | None = Field(None, description="PEM certificate chain: the API over HTTPS.")
    tls_key: Path | None = None
    tls_client_ca: Path | None = Field(None, description="CA bundle; set to require mTLS.")
    ca_dir: Path = Field(Path("framerelay-ca"), description="The pod CA (ca.pem, ca.key).")
    ca_key_group_readable: bool = Field(
        False,
        description="Accept a ca.key its group may read (mode 0440: a Kubernetes Secret "
        "mounted for the pod's fsGroup); else only its owner may (0600 or 0400).",
    )
    pod_cert_ttl_h: float = Field(72.0, ge=1, le=2160, description="Lifetime of pod certificates.")
    ingest_url: str | None = Field(
        None,
        description="Ingest API to push assignments to; several sharded replicas as "
        "comma-separated URLs (each call goes to all).",
    )
    ingest_ca: Path | None = Field(None, description="CA bundle to verify an https ingest.")
    allow_insecure_ingest: bool = Field(
        False,
        description="Allow plain http:// to an ingest on another host (its tokens then cross "
        "the network unencrypted); else http:// is for loopback only.",
    )
    tick_s: float = Field(2.0, gt=0, le=3600, description="Reconcile period.")
    lease_ttl_s: float = Field(
        15.0, gt=0, le=3600, description="Leader lease; one active orchestrator."
    )
    canary_interval_s: float = Field(
        30.0, gt=0, le=86_400, description="Canary period per ready worker."
    )
    canary_timeout_s: float = Field(10.0, gt=0, le=600, description="Deadline of one canary.")
    canary_min_persons: int = Field(
        3, ge=1, le=1000, description="Persons the canary frame must yield."
    )
    model_registry: Path | None = Field(
        None,
        description="The model registry (docs/models.md): each loaded model other than a "
        "worker's default is checked against its own canary from it.",
    )
    heartbeat_timeout_s: float = Field(2.0, gt=0, le=600, description="Deadline of one /healthz.")
    unhealthy_after: int = Field(
        2, ge=1, le=1000, description="Consecutive failures before replacing."
    )
    startup_grace_s: float = Field(
        900.0, gt=0, le=86_400, description="Time a new pod has to get ready."
    )
    drain_timeout_s: float = Field(
        120.0, ge=0, le=86_400, description="Most a draining pod is kept."
    )
    create_backoff_s: float = Field(
        10.0,
        gt=0,
        le=86_400,
        description="Wait after a failed create (doubling per failure in a row).",
    )
    create_backoff_max_s: float = Field(
        600.0, gt=0, le=86_400, description="Longest wait between creates."
    )
    max_replacements: int = Field(
        3, ge=0, le=1000, description="Restart budget per tier and window."
    )
    replacement_window_s: float = Field(600.0, gt=0, le=7 * 86_400)
    target_utilization: float = Field(0.8, gt=0, le=1, description="Fill workers to this share.")
    default_capacity_fps: float = Field(
        20.0, gt=0, le=1_000_000, description="Per worker, before measured."
    )
    rtt_interval_s: float = Field(
        30.0,
        gt=0,
        le=86_400,
        description="How often the ingest measures each ready worker's round trip (POST "
        "/v1/rtt); a worker is measured as soon as it is ready.",
    )
    rtt_pings: int = Field(5, ge=1, le=20, description="Pings per measurement (their median).")
    region_slack_ms: float = Field(
        10.0,
        ge=0,
        le=600_000,
        description="Regions whose round trips differ by at most this count as equally close "
        "(price decides between them).",
    )
    model_costs: dict[str, Annotated[float, Field(gt=0, le=1000)]] = Field(
        default_factory=lambda: {"yolox_nano": 1.0},
        description="Demand weight of each model relative to the reference model.",
    )
    gpu_catalog: dict[str, GpuTypeConfig] = Field(
        default_factory=dict,
        description="GPU type -> VRAM, measured capacity per model, list price (sizing by need).",
    )
    model_vram_gb: dict[str, Annotated[float, Field(gt=0, le=4096)]] = Field(
        default_factory=dict, description="VRAM each model takes when loaded (sizing by need)."
    )
    runpod: RunPodSettings = Field(default_factory=RunPodSettings)
    local: LocalSettings = Field(default_factory=LocalSettings)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    jobs: JobsSettings = Field(
        default_factory=JobsSettings, description="Batch jobs (docs/jobs.md)."
    )

    @field_validator("fleet")
    @classmethod
    def _fleet(cls, v: str) -> str:
        if not v.isalnum() or not v.islower():
            raise ValueError("fleet must be lowercase letters and digits (it prefixes pod names)")
        return v

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, v: SecretStr) -> SecretStr:
        problem = redis_url_problem(v.get_secret_value())
        if problem is not None:
            raise ValueError(problem)
        return v

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {v!r}; use an IANA name such as Europe/Paris"
            ) from None
        return v

    @field_validator("tiers")
    @classmethod
    def _tiers(cls, v: list[TierConfig]) -> list[TierConfig]:
        names = [t.name for t in v]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be unique, got {names}")
        return v

    @model_validator(mode="after")
    def _tls_files(self) -> OrchestratorSettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together (the API's HTTPS)")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca (mTLS) needs tls_cert and tls_key as well")
        return self

    @model_validator(mode="after")
    def _ingest_transport(self) -> OrchestratorSettings:
        if self.ingest_url is None or self.allow_insecure_ingest:
            return self
        for url in self.ingest_url.split(","):
            problem = plain_http_problem(url.strip(), "the ingest API")
            if problem is not None:
                raise ValueError(
                    f"ingest_url: {problem} (verified with FRAMERELAY_ORCH_INGEST_CA), or set "
                    "FRAMERELAY_ORCH_ALLOW_INSECURE_INGEST=true on a network you trust"
                )
        return self

    @model_validator(mode="after")
    def _sizing(self) -> OrchestratorSettings:
        for t in self.tiers:
            unknown = [m for m in t.models if m not in self.model_vram_gb]
            if unknown:
                raise ValueError(
                    f"tier {t.name}: models {unknown} need their VRAM in model_vram_gb"
                )
            need = sum(self.model_vram_gb[m] for m in t.models)
            known = [self.gpu_catalog[g] for g in t.gpu_types if g in self.gpu_catalog]
            if t.models and known and len(known) == len(t.gpu_types):
                if all(c.vram_gb < need for c in known):
                    raise ValueError(
                        f"tier {t.name}: no GPU type in gpu_types has the {need:g} GB of VRAM "
                        f"its models take ({', '.join(t.models)})"
                    )
        return self

    @model_validator(mode="after")
    def _provider_tiers(self) -> OrchestratorSettings:
        check = {"runpod": self.runpod.tier_problem, "kubernetes": self.kubernetes.tier_problem}
        problem = check[self.provider](self.tiers) if self.provider in check else None
        if problem is not None:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _volumes(self) -> OrchestratorSettings:
        wanted = {"runpod": "runpod_id", "kubernetes": "claim", "local": "local_dir"}
        field = wanted[self.provider]
        for t in self.tiers:
            v = t.volume
            if v is None:
                continue
            if getattr(v, field) is None:
                raise ValueError(f"tier {t.name}: volume needs {field} for the {self.provider} "
                                 "provider")  # fmt: skip
            if v.data_center and t.data_centers and v.data_center not in t.data_centers:
                raise ValueError(
                    f"tier {t.name}: its network volume is in {v.data_center}, which is not "
                    f"in its data_centers {list(t.data_centers)} (RunPod mounts a network "
                    "volume only in its own data centre)"
                )
        volumes = {t.name: t.volume for t in self.tiers if t.volume is not None}
        for provider in (self.runpod, self.local, self.kubernetes):
            provider.set_volumes(volumes)
        return self

    def tier(self, name: str) -> TierConfig | None:
        return next((t for t in self.tiers if t.name == name), None)
