"""GPU worker settings (env prefix ``FRAMERELAY_WORKER_``)."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from framerelay.auth.tokens import WORKER_ID
from framerelay.errors import ConfigError
from framerelay.model_registry import BUILTIN_NAME, MODEL_NAME
from framerelay.settings import DEFAULT_MODEL, ServiceSettings
from gpu_worker.detectors.base import OnnxDetectorSettings, UltralyticsDetectorSettings
from gpu_worker.faults import parse_fault

PREFIX = "FRAMERELAY_WORKER_"
RENAMED = {"FRAMERELAY_WORKER_FAULT": "FRAMERELAY_WORKER_TEST_FAULT (test only, with _TEST_HOOKS)"}
RETIRED = {
    "FRAMERELAY_WORKER_TRACKER": "each stream names its tracker (the ingest's stream setting "
    "'tracker', sent in OPEN); the worker never used a default of its own",
}
"""Settings that are gone, with what replaces them (warned about, never an error)."""

DetectorField = Annotated[
    OnnxDetectorSettings | UltralyticsDetectorSettings, Field(discriminator="type")
]


class WorkerSettings(ServiceSettings):
    """Everything a worker needs; every field can come from the environment."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        hide_input_in_errors=True,
        allow_inf_nan=False,  # every float setting is finite (and bounded below)
    )
    env_retired: ClassVar[frozenset[str]] = frozenset({*RENAMED, *RETIRED})

    host: str = Field("127.0.0.1", description="Address to listen on (0.0.0.0 in a pod).")
    port: int = Field(8443, ge=0, le=65535, description="0 picks a free port.")
    max_connections: int = Field(
        1000, ge=1, le=1_000_000, description="Open connections at most; one more gets 503."
    )
    max_connections_per_peer: int = Field(
        50,
        ge=0,
        le=1_000_000,
        description="Open connections from one address at most (one more gets 503); 0 = no "
        "per-address cap.",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        le=600,
        description="The TLS handshake and the request head (HTTP or tunnel upgrade) must be "
        "done this long after a connection opened; else it is closed.",
    )
    worker_id: str = Field(
        default_factory=socket.gethostname,
        pattern=WORKER_ID,
        description="This worker's name (default: the host name); tunnel tokens must grant "
        "worker:<worker_id>.",
    )
    token_secrets: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("token_secrets", "FRAMERELAY_TOKEN_SECRETS"),
        description="HS256 shared secrets (one host only); tokens must grant worker:<worker_id>.",
    )
    tunnel_keys: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("tunnel_keys", "FRAMERELAY_WORKER_TUNNEL_KEYS"),
        description="The PUBLIC key set (JWKS, 'framerelay keys public') tunnel tokens verify "
        "against; a private key is refused.",
    )
    token_leeway_s: float = Field(30.0, ge=0, le=3600, description="Clock skew allowed on tokens.")
    auth_max_failures: int = Field(
        20, ge=1, le=1_000_000, description="Failed authentications per address per window."
    )
    auth_window_s: float = Field(60.0, gt=0, le=86_400, description="The throttling window.")
    metrics_auth: bool = Field(False, description="/metrics needs a token (metrics:read).")
    detector: DetectorField = Field(
        default_factory=lambda: OnnxDetectorSettings(model=DEFAULT_MODEL)
    )
    model_registry: Path | None = Field(
        None,
        description="A model registry file (TOML or JSON, docs/models.md): the models a stream "
        "may name besides the default; the built-in COCO model is always there.",
    )
    default_model: str = Field(
        BUILTIN_NAME,
        pattern=MODEL_NAME,
        description="The name the detector above is served under (streams naming no model).",
    )
    volume_dir: Path | None = Field(
        None,
        description="The shared (network) volume's mount (the orchestrator sets it for a "
        "tier's volume): a model file, model registry, built artefact or TensorRT engine "
        "under it is used only when the volume's signed manifest "
        "(<volume_dir>/framerelay/manifest.jwt, 'framerelay volume sign') lists its size "
        "and sha256, verified with the worker's public key set; a .pt (a pickle) or an "
        "Ultralytics model is never loaded from it; this worker's own builds go to a "
        "pod-local cache and are written back unsigned. None: no shared volume, every "
        "path is the worker's own.",
    )
    volume_local_dir: Path | None = Field(
        None,
        description="Pod-local folder for verified copies of volume files and this "
        "worker's own builds (never on the volume); None: a private temporary folder, "
        "removed when the worker exits.",
    )
    vram_budget_mb: float = Field(
        0.0,
        ge=0,
        le=10_000_000,
        description="GPU memory (MiB) the models may take together, by their registry "
        "vram_mb; past it the least recently used model without streams is evicted; "
        "0 = no budget.",
    )
    max_batch: int = Field(
        0,
        ge=0,
        le=256,
        description="Frames per inference batch; 0 = auto: 1 on CPU (batching only adds "
        "latency there), the detector's max_batch on GPU.",
    )
    batch_wait_ms: float = Field(0.0, ge=0, le=100, description="Extra wait to fill a batch.")
    queue_capacity: int = Field(
        64,
        ge=1,
        le=4096,
        description="Frames waiting for inference, shared round-robin between tunnels: one "
        "tunnel holds at most capacity / open tunnels of them.",
    )
    max_inflight: int = Field(4, ge=1, le=64, description="Credit cap per stream.")
    max_streams_per_connection: int = Field(256, ge=1, le=4096)
    result_min_confidence: float = Field(
        0.25, ge=0, le=1, description="Untracked detections below this are not sent."
    )
    snapshot_interval_s: float = Field(
        1.0,
        ge=0,
        le=3600,
        description="Send each stream's tracker snapshot this often (stream time), and after "
        "a frame that reports a new track id; 0 = never.",
    )
    decode_threads: int = Field(2, ge=1, le=64)
    jpeg_decoder: Literal["auto", "cpu", "cpu-batch", "nvimgcodec"] = Field(
        "auto",
        description="JPEG decoding (gpu_worker/jpeg_batch.py): cpu (simplejpeg on the "
        "decode_threads, each frame as it arrives), cpu-batch (the same threads, a whole "
        "batch at a time in a stage before inference), nvimgcodec (one nvImageCodec call per "
        "batch on the GPU in that stage; refused at start where it cannot run), auto = "
        "cpu-batch where a GPU is seen, else cpu.",
    )
    max_bad_frames_per_s: int = Field(
        20,
        ge=0,
        le=1_000_000,
        description="Invalid FRAME headers and undecodable images one tunnel may send per "
        "second before it is closed (1008); 0 = no limit. A correct ingest sends none.",
    )
    max_refused_frames_per_s: int = Field(
        500,
        ge=0,
        le=1_000_000,
        description="Refused frames (unknown stream, credit exceeded, full lane, bad) one "
        "tunnel may cause per second; beyond it that tunnel is read more slowly; 0 = no limit.",
    )
    max_tunnel_faults: int = Field(
        10,
        ge=0,
        le=1_000_000,
        description="Tunnels one address may have closed for protocol errors or too many bad "
        "frames per auth_window_s; beyond, its new tunnels get 429; 0 = no limit.",
    )
    inference_stall_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="A batch running longer than this makes the worker unready (/readyz 503) "
        "and closes its tunnels (1011) until the batch finishes.",
    )
    max_message_bytes: int = Field(8 * 1024 * 1024, ge=64 * 1024)
    tls_cert: Path | None = Field(None, description="PEM certificate chain; enables wss://.")
    tls_key: Path | None = None
    tls_client_ca: Path | None = Field(None, description="CA bundle; set to require mTLS.")
    tls_cert_pem: SecretStr | None = Field(
        None, description="The certificate chain as PEM text (a provider's env), instead of a file."
    )
    tls_key_pem: SecretStr | None = Field(None, description="Its private key as PEM text.")
    warmup_runs: int = Field(3, ge=1, le=100)
    shutdown_timeout_s: float = Field(10.0, gt=0, le=3600)
    test_hooks: bool = Field(False, description="TEST ONLY: allow test_fault.")
    test_fault: str | None = Field(
        None,
        description="TEST ONLY fault (hang_inference_after:N, raise_inference_after:N, "
        "raise_track_after:N); needs test_hooks.",
    )

    @model_validator(mode="before")
    @classmethod
    def _detector_defaults(cls, data: object) -> object:
        """A detector given in part (e.g. only ``FRAMERELAY_WORKER_DETECTOR__FP16``, or the
        image's engine cache directory) is the default ONNX detector with those fields."""
        if isinstance(data, dict) and isinstance(data.get("detector"), dict):
            detector = dict(data["detector"])
            detector.setdefault("type", "onnx")
            if detector["type"] == "onnx":
                detector.setdefault("model", str(DEFAULT_MODEL))
            data = {**data, "detector": detector}
        return data

    @model_validator(mode="after")
    def _hooks_are_test_only(self) -> WorkerSettings:
        if self.test_fault and not self.test_hooks:
            raise ConfigError(
                "FRAMERELAY_WORKER_TEST_FAULT is a test hook: it is refused unless "
                "FRAMERELAY_WORKER_TEST_HOOKS=true (never set either in production)"
            )
        parse_fault(self.test_fault)  # ConfigError for an unknown fault
        if (self.tls_cert_pem is None) != (self.tls_key_pem is None):
            raise ConfigError("set both FRAMERELAY_WORKER_TLS_CERT_PEM and ..._TLS_KEY_PEM")
        if self.tls_cert_pem is not None and self.tls_cert is not None:
            raise ConfigError("set FRAMERELAY_WORKER_TLS_CERT (a file) or ..._TLS_CERT_PEM")
        return self

    @model_validator(mode="after")
    def _local_dir_off_the_volume(self) -> WorkerSettings:
        local, volume = self.volume_local_dir, self.volume_dir
        if (
            local is not None
            and volume is not None
            and local.resolve().is_relative_to(volume.resolve())
        ):
            raise ConfigError(
                "FRAMERELAY_WORKER_VOLUME_LOCAL_DIR is on the shared volume "
                "(FRAMERELAY_WORKER_VOLUME_DIR): give a pod-local folder, or leave it unset"
            )
        return self


def unknown_env(environ: Mapping[str, str]) -> list[str]:
    """``FRAMERELAY_WORKER_*`` names that are no setting.

    Names only, never values. A typo is refused when the settings are built
    (:meth:`ServiceSettings.env_problem`, naming the nearest setting); the
    renamed and retired names (the old ``FRAMERELAY_WORKER_FAULT``) are only
    warned about (:func:`env_warnings`), never silently ignored.
    """
    names = {f"{PREFIX}{n.upper()}": "SecretStr" in str(f.annotation)
             for n, f in WorkerSettings.model_fields.items()}  # fmt: skip

    def known(var: str) -> bool:
        base = var.removesuffix("_FILE")
        return var in names or names.get(base, False) or var.split("__")[0] in names

    return sorted(v for v in environ if v.upper().startswith(PREFIX) and not known(v.upper()))


def env_warnings(environ: Mapping[str, str]) -> list[str]:
    """One warning per ignored ``FRAMERELAY_WORKER_*`` name, saying what replaced it if
    it was renamed or retired (names only, never values)."""
    out = []
    for name in unknown_env(environ):
        key = name.upper()
        if key in RENAMED:
            out.append(f"ignoring {name}: not a worker setting; it is now {RENAMED[key]}")
        elif key in RETIRED:
            out.append(f"ignoring {name}: retired, it has no effect: {RETIRED[key]}")
        else:
            out.append(f"ignoring {name}: not a worker setting")
    return out
