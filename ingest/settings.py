"""Ingest settings (env prefix ``FRAMERELAY_INGEST_``) and stream definitions."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from framerelay.wire import STREAM_ID


class StreamConfig(BaseModel):
    """One camera or file and how to read it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=STREAM_ID, description="Unique stream id (letters, digits, ._:-).")
    url: str = Field(
        min_length=1, description="Anything PyAV opens: file path, rtsp://, https://..."
    )
    fps: float = Field(
        5.0, ge=0, le=240, description="Sampling target by PTS; 0 keeps every frame."
    )
    realtime: bool = Field(
        False,
        description="Live behaviour: pace files at their frame rate and drop (newest wins) "
        "instead of waiting when the worker is busy. Set for cameras.",
    )
    loop: bool = Field(False, description="Start a file over at its end (new epoch each pass).")
    max_frames: int = Field(
        0, ge=0, description="Stop after this many decoded frames (0 = no limit)."
    )
    jpeg_quality: int = Field(90, ge=1, le=100)
    tracker: str = Field("default", max_length=64)
    open_timeout_s: float = Field(10.0, gt=0)
    read_timeout_s: float = Field(10.0, gt=0)


class IngestSettings(BaseSettings):
    """Where the worker is, how to authenticate, and what to serve."""

    model_config = SettingsConfigDict(
        env_prefix="FRAMERELAY_INGEST_", env_nested_delimiter="__", extra="forbid"
    )

    worker_url: str = Field(
        "ws://127.0.0.1:8443/v1/tunnel", description="wss://host:port/v1/tunnel across clouds."
    )
    token: SecretStr | None = Field(None, description="Tunnel token granting worker:<id>.")
    token_secrets: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("token_secrets", "FRAMERELAY_TOKEN_SECRETS"),
        description="Alternatively, secrets to mint the tunnel token locally.",
    )
    worker_id: str = Field("*", description="Worker id to scope a locally minted token to.")
    tls_ca: Path | None = Field(None, description="CA bundle to verify the worker (wss://).")
    tls_client_cert: Path | None = Field(None, description="Client certificate for mTLS.")
    tls_client_key: Path | None = None
    max_inflight: int = Field(4, ge=1, le=64, description="Credit cap per stream.")
    frame_timeout_s: float = Field(10.0, gt=0, description="Give up on a frame with no answer.")
    reconnect_max_s: float = Field(10.0, gt=0)
    streams: list[StreamConfig] = Field(default_factory=list)
    api_host: str = "127.0.0.1"
    api_port: int = Field(8080, ge=0, le=65535)
    out: Path | None = Field(None, description="Also append results to this JSON Lines file.")
