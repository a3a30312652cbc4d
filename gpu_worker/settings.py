"""GPU worker settings (env prefix ``FRAMERELAY_WORKER_``)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from framerelay.settings import DEFAULT_MODEL
from gpu_worker.detectors.base import OnnxDetectorSettings, UltralyticsDetectorSettings

DetectorField = Annotated[
    OnnxDetectorSettings | UltralyticsDetectorSettings, Field(discriminator="type")
]


class WorkerSettings(BaseSettings):
    """Everything a worker needs; every field can come from the environment."""

    model_config = SettingsConfigDict(
        env_prefix="FRAMERELAY_WORKER_", env_nested_delimiter="__", extra="forbid"
    )

    host: str = Field("127.0.0.1", description="Address to listen on (0.0.0.0 in a pod).")
    port: int = Field(8443, ge=0, le=65535, description="0 picks a free port.")
    worker_id: str = Field(default_factory=socket.gethostname, max_length=128)
    token_secrets: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("token_secrets", "FRAMERELAY_TOKEN_SECRETS"),
        description="Comma-separated HMAC secrets; tokens must grant worker:<worker_id>.",
    )
    detector: DetectorField = Field(
        default_factory=lambda: OnnxDetectorSettings(model=DEFAULT_MODEL)
    )
    tracker: str = Field("default", description="Tracker used when OPEN names none.")
    max_batch: int = Field(
        0,
        ge=0,
        le=256,
        description="Frames per inference batch; 0 = auto: 1 on CPU (batching only adds "
        "latency there), the detector's max_batch on GPU.",
    )
    batch_wait_ms: float = Field(0.0, ge=0, le=100, description="Extra wait to fill a batch.")
    queue_capacity: int = Field(64, ge=1, le=4096, description="Frames waiting for inference.")
    max_inflight: int = Field(4, ge=1, le=64, description="Credit cap per stream.")
    max_streams_per_connection: int = Field(256, ge=1, le=4096)
    result_min_confidence: float = Field(
        0.25, ge=0, le=1, description="Untracked detections below this are not sent."
    )
    snapshot_interval_s: float = Field(
        1.0,
        ge=0,
        le=3600,
        description="Send each stream's tracker snapshot this often (stream time); 0 = never.",
    )
    decode_threads: int = Field(2, ge=1, le=64)
    max_message_bytes: int = Field(8 * 1024 * 1024, ge=64 * 1024)
    tls_cert: Path | None = Field(None, description="PEM certificate chain; enables wss://.")
    tls_key: Path | None = None
    tls_client_ca: Path | None = Field(None, description="CA bundle; set to require mTLS.")
    warmup_runs: int = Field(3, ge=1, le=100)
    shutdown_timeout_s: float = Field(10.0, gt=0)
