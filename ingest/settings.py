"""Ingest settings (env prefix ``FRAMERELAY_INGEST_``) and stream definitions."""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    IPvAnyNetwork,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import NoDecode, SettingsConfigDict

from framerelay.auth.tokens import WORKER_ID
from framerelay.jobs import JobTask
from framerelay.listeners import ListenerSettings
from framerelay.model_registry import MODEL_NAME
from framerelay.redact import redact_options, redact_url, url_has_userinfo
from framerelay.settings import ServiceSettings, redis_url_problem
from framerelay.tracker_times import TrackerTimesConfig
from framerelay.wire import STREAM_ID
from ingest.serverless_link import ServerlessSettings
from ingest.shard_settings import ShardSettings
from ingest.source_options import option_problem
from ingest.source_policy import DENIED_NETWORKS
from ingest.urls import ORCHESTRATOR_TOKEN_ENV as ORCHESTRATOR_TOKEN_ENV
from ingest.urls import URL_SCHEMES as URL_SCHEMES
from ingest.urls import orchestrator_url_problem as orchestrator_url_problem
from ingest.urls import url_problem as url_problem

OPTION_KEY = re.compile(r"[a-z0-9_]{1,64}")
MAX_SOURCE_SIDE = 16_384
"""The largest source side the wire carries (``framerelay.wire.Frame.src_w``)."""
LIVE_SCHEMES = frozenset({"rtsp", "rtsps", "rtmp", "rtmps", "rtmpt", "rtp", "udp", "tcp", "srt"})
"""URL schemes whose end-of-file means a disconnect (the camera is still there)."""


class StreamConfig(BaseModel):
    """One camera or file and how to read it."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, hide_input_in_errors=True, allow_inf_nan=False
    )

    id: str = Field(pattern=STREAM_ID, description="Unique stream id (letters, digits, ._:-).")
    url: str = Field(
        min_length=1,
        max_length=4096,
        repr=False,  # may hold user:password@
        description="rtsp(s)://, rtmp(s)://, http(s):// (HLS, MJPEG), udp://, rtp:// or a "
        "file path (over the API: under FRAMERELAY_INGEST_FILE_ROOTS only). Credentials may "
        "be given as user:password@ (never logged).",
    )
    fps: float = Field(
        5.0, ge=0, le=240, description="Sampling target by PTS; 0 keeps every frame."
    )
    realtime: bool = Field(
        False,
        description="Live behaviour for files: pace at the frame rate and drop (newest wins) "
        "instead of waiting when the worker is busy. Live sources always behave so.",
    )
    loop: bool = Field(False, description="Start a file over at its end (new epoch each pass).")
    max_frames: int = Field(
        0, ge=0, le=10**12, description="Stop after this many decoded frames (0 = no limit)."
    )
    jpeg_quality: int = Field(90, ge=1, le=100)
    tracker: str = Field("default", max_length=64)
    tracker_settings: TrackerTimesConfig | None = Field(
        None, description="The stream's own tracker time settings (null: the worker's)."
    )
    model: str | None = Field(
        None,
        pattern=MODEL_NAME,
        description="The model the worker runs on this stream (a name in the worker's "
        "model registry; null: the worker's default model).",
    )
    open_timeout_s: float = Field(10.0, gt=0, le=300, description="Give up opening after this.")
    read_timeout_s: float = Field(
        10.0, gt=0, le=300, description="No packet for this long: the source stalled; reconnect."
    )
    live: bool | None = Field(
        None,
        description="End of stream is a disconnect (reconnect) rather than the end. "
        "Default: true for rtsp/rtmp/udp/tcp/srt URLs, false for files and http(s)/HLS.",
    )
    rtsp_transport: Literal["tcp", "udp"] = Field("tcp", description="RTP over TCP or UDP.")
    username: str | None = Field(
        None, max_length=256, description="Source user name (instead of putting it in the URL)."
    )
    password: SecretStr | None = Field(
        None, description="Source password; never logged or returned by the API."
    )
    options: dict[str, str] = Field(
        default_factory=dict,
        repr=False,  # may hold headers or keys
        max_length=32,
        description="Extra FFmpeg options for av.open, from an allowlist (rtsp_transport, "
        "timeout, buffer_size, user_agent... docs/cameras.md); they override the "
        "per-protocol defaults.",
    )
    reconnect_initial_s: float = Field(
        0.5, gt=0, le=60, description="First reconnect delay (doubles per failed attempt)."
    )
    reconnect_max_s: float = Field(10.0, gt=0, le=600, description="Reconnect delay cap.")
    healthy_after_s: float = Field(
        30.0,
        ge=0,
        le=86_400,
        description="Running this long resets the backoff to its first delay.",
    )
    max_retries: int | None = Field(
        None,
        ge=0,
        le=10**9,
        description="Failed attempts in a row before FAILED; null retries forever.",
    )
    auth_retry_s: float = Field(
        300.0,
        gt=0,
        le=86_400,
        description="The camera refused the credentials (401/403): AUTH_FAILED, next attempt "
        "after this long (not at the reconnect backoff: no account lockouts).",
    )
    min_width: int = Field(
        32, ge=1, le=MAX_SOURCE_SIDE, description="Narrower sources are refused (FAILED)."
    )
    min_height: int = Field(
        32, ge=1, le=MAX_SOURCE_SIDE, description="Lower sources are refused (FAILED)."
    )
    max_width: int = Field(
        3840,
        ge=1,
        le=MAX_SOURCE_SIDE,
        description="Sources that do not fit max_width x max_height (either orientation) are "
        "refused (FAILED) before any frame is decoded or sent.",
    )
    max_height: int = Field(2160, ge=1, le=MAX_SOURCE_SIDE, description="See max_width.")
    max_epochs_per_min: int = Field(
        30,
        ge=1,
        le=3600,
        description="Discontinuities that may start an epoch per 60 s; past it they are counted "
        "(corrupt_timestamps) and frames are sampled in decode order.",
    )

    latency_slo_ms: float | None = Field(
        None,
        gt=0,
        le=600_000,
        description="Latency objective in ms (null: none): a result later than this after "
        "capture (RTSP: the camera's clock from RTCP sender reports; else the decode time) "
        "counts as a breach (framerelay_ingest_slo_breaches_total).",
    )

    job: JobTask | None = Field(
        None,
        description="Makes this stream a batch job's task (docs/jobs.md): read once at full "
        "speed from its checkpoint, results also written to job.sidecar (null: a stream).",
    )

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        problem = url_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("options")
    @classmethod
    def _check_options(cls, value: dict[str, str]) -> dict[str, str]:
        for key, val in value.items():
            if not OPTION_KEY.fullmatch(key):
                raise ValueError("bad FFmpeg option name: names are [a-z0-9_]{1,64}")
            problem = option_problem(key, val)
            if problem is not None:
                raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _check_sizes(self) -> StreamConfig:
        if self.min_width > self.max_width or self.min_height > self.max_height:
            raise ValueError(
                f"min_width x min_height ({self.min_width}x{self.min_height}) must not exceed "
                f"max_width x max_height ({self.max_width}x{self.max_height})"
            )
        return self

    @model_validator(mode="after")
    def _check_credentials(self) -> StreamConfig:
        if self.password is not None and self.username is None:
            raise ValueError("password given without username")
        if self.username is not None and url_has_userinfo(self.url):
            raise ValueError(
                "credentials given twice: put user:password@ in the URL or set "
                "username/password, not both"
            )
        return self

    @model_validator(mode="after")
    def _check_job(self) -> StreamConfig:
        if self.job is not None:
            problem = job_problem(self)
            if problem is not None:
                raise ValueError(problem)
        return self

    def public(self) -> dict[str, Any]:
        """This definition for API answers: URL credentials, password and secret-named
        FFmpeg options masked (:mod:`framerelay.redact`)."""
        data = self.model_dump(mode="json")
        data["url"] = redact_url(self.url)
        data["password"] = "***" if self.password is not None else None
        data["options"] = redact_options(self.options)
        return data

    def stored(self) -> dict[str, Any]:
        """This definition for the stream store, secrets included (keep the store private)."""
        data = self.model_dump(mode="json")
        if self.password is not None:
            data["password"] = self.password.get_secret_value()
        return data


def job_problem(config: StreamConfig) -> str | None:
    """Why ``config`` cannot run its job task (None: it can)."""
    job = config.job
    if job is None:
        return None
    if config.realtime or config.loop or config.live or config.max_frames:
        return ("a job task is read once at full speed: realtime, loop and live must be "
                "false and max_frames 0")  # fmt: skip
    if config.url.partition("://")[0].lower() in LIVE_SCHEMES:
        return "a job task reads a file or a recording, not a live source"
    sidecar = PurePosixPath(job.sidecar)
    if not sidecar.is_absolute() or sidecar.suffix != ".jsonl" or ".." in sidecar.parts:
        return "job.sidecar must be an absolute path ending in .jsonl, without '..'"
    return None


class ResultsSettings(BaseModel):
    """Results delivery: the WebSocket hub's limits and the Redis streams.

    Env: ``FRAMERELAY_INGEST_RESULTS__<NAME>``; Redis itself is ``FRAMERELAY_REDIS_URL``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    queue_size: int = Field(
        256, ge=1, le=100_000, description="Results queued per subscriber; beyond, drop oldest."
    )
    send_timeout_s: float = Field(
        5.0, gt=0, le=300, description="A send blocked this long disconnects the subscriber."
    )
    max_subscribers: int = Field(1000, ge=1, le=100_000, description="Open subscribers at most.")
    ping_interval_s: float = Field(
        10.0, ge=0, le=3600, description="WebSocket keepalive ping interval (0: none)."
    )
    ping_timeout_s: float = Field(
        10.0, gt=0, le=3600, description="No pong in this long: the subscriber is dropped."
    )
    send_buffer_bytes: int = Field(
        262_144,
        ge=0,
        le=64 * 1024 * 1024,
        description="Kernel send buffer per subscriber socket (0: OS default).",
    )
    tcp_user_timeout_s: float = Field(
        30.0,
        ge=0,
        le=3600,
        description="Unacknowledged data this old: the kernel drops the socket.",
    )
    history: int = Field(
        1024, ge=0, le=1_000_000, description="Results per stream kept in memory for resume."
    )
    history_s: float = Field(
        120.0,
        ge=0,
        le=86_400,
        description="...and none older than this, in seconds (0: no age limit); "
        "older results are resumed from Redis when it is configured.",
    )
    resume_max: int = Field(2000, ge=0, le=100_000, description="Results replayed per resume.")
    redis_prefix: str = Field(
        "framerelay", pattern=r"^[A-Za-z0-9._:-]{1,64}$", description="Redis key prefix."
    )
    redis_maxlen: int = Field(
        100_000,
        ge=1,
        le=10**9,
        description="Approximate entries kept per durable stream (MAXLEN ~).",
    )
    redis_retention_s: float = Field(
        86_400.0,
        gt=0,
        le=10 * 366 * 86_400,
        description="Durable entries older than this are trimmed (MINID ~).",
    )
    redis_buffer: int = Field(
        10_000,
        ge=1,
        le=10_000_000,
        description="Results waiting for Redis at most; beyond, drop oldest.",
    )
    redis_batch: int = Field(256, ge=1, le=10_000, description="Results per pipeline.")
    redis_live: bool = Field(True, description="Also PUBLISH each result on the live channel.")
    redis_timeout_s: float = Field(2.0, gt=0, le=60, description="Per Redis round trip.")


class IngestSettings(ServiceSettings):
    """Where the worker is, how to authenticate, and what to serve.

    Every ``SecretStr`` setting ``X`` also reads the file named by ``X_FILE``
    (e.g. ``FRAMERELAY_SIGNING_KEYS_FILE``).
    """

    model_config = SettingsConfigDict(
        env_prefix="FRAMERELAY_INGEST_",
        env_nested_delimiter="__",
        extra="forbid",
        hide_input_in_errors=True,
    )

    worker_url: str = Field(
        "ws://127.0.0.1:8443/v1/tunnel", description="wss://host:port/v1/tunnel across clouds."
    )
    token: SecretStr | None = Field(None, description="Tunnel token granting worker:<id>.")
    token_secrets: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("token_secrets", "FRAMERELAY_TOKEN_SECRETS"),
        description="HS256 shared secrets (single host only): mint tunnel tokens and verify "
        "API tokens with them.",
    )
    signing_keys: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("signing_keys", "FRAMERELAY_SIGNING_KEYS"),
        description="The primary cloud's private key set (JWKS from 'framerelay keys "
        "generate'): mints tunnel tokens (aud framerelay-worker) and verifies API tokens "
        "(aud framerelay-ingest). A public set suffices with a fixed FRAMERELAY_INGEST_TOKEN.",
    )
    revoked_tokens_file: Path | None = Field(
        None,
        validation_alias=AliasChoices("revoked_tokens_file", "FRAMERELAY_REVOKED_TOKENS_FILE"),
        description="Revoked tokens, one jti:<id> or sub:<holder> a line (docs/security.md); "
        "read again within a second of a change, and open sessions of a revoked token end.",
    )
    token_leeway_s: float = Field(
        30.0, ge=0, le=3600, description="Clock skew allowed on exp/nbf/iat of API tokens."
    )
    auth_max_failures: int = Field(
        20, ge=1, le=1_000_000, description="Failed authentications per peer address per window "
        "before it is refused with 429.",
    )  # fmt: skip
    auth_window_s: float = Field(
        60.0, gt=0, le=86_400, description="Window of auth_max_failures, in seconds."
    )
    metrics_auth: bool = Field(False, description="GET /metrics needs a metrics:read token.")
    max_body_bytes: int = Field(
        1_048_576,  # framerelay.web_limits.DEFAULT_MAX_BODY_BYTES
        ge=1,
        le=1 << 30,
        description="Largest API request body; a larger one is refused with 413.",
    )
    api_tls_cert: Path | None = Field(
        None, description="Serve the API (REST and the results WebSocket) over HTTPS/WSS."
    )
    api_tls_key: Path | None = Field(None, description="Private key of api_tls_cert.")
    api_tls_client_ca: Path | None = Field(
        None, description="mTLS: API clients must present a certificate signed by this CA."
    )
    allow_insecure_workers: bool = Field(
        False,
        description="Allow plain ws:// to workers that are not on this host (loopback is "
        "always allowed). Frames then cross the network unencrypted.",
    )
    worker_id: str = Field(
        "*",
        pattern=rf"^\*$|{WORKER_ID}",
        description="The default worker's id, to scope its locally minted tunnel token to "
        "(default *: any worker, for one host; name the worker when it is remote). Ids that "
        "placements name are always one worker's name.",
    )
    tls_ca: Path | None = Field(None, description="CA bundle to verify the worker (wss://).")
    tls_client_cert: Path | None = Field(None, description="Client certificate for mTLS.")
    tls_client_key: Path | None = None
    max_inflight: int = Field(4, ge=1, le=64, description="Credit cap per stream.")
    frame_timeout_s: float = Field(10.0, gt=0, description="Give up on a frame with no answer.")
    reconnect_max_s: float = Field(10.0, gt=0)
    heartbeat_interval_s: float = Field(
        0.5, gt=0, le=60, allow_inf_nan=False,
        description="Ping each worker tunnel this often (one ping outstanding at a time).",
    )  # fmt: skip
    stall_after_s: float = Field(
        3.0, gt=0, le=3600, allow_inf_nan=False,
        description="No heartbeat or result for this long (at least; derived from the streams' "
        "fps and the round trip): the tunnel is STALLED and its streams fail over.",
    )  # fmt: skip
    streams: list[StreamConfig] = Field(default_factory=list)
    file_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="Folders whose files streams added over the API may read (JSON list or "
        "':'-separated); default none: the API adds no local file (streams in the settings "
        "or a config file may read any).",
    )
    source_denied_networks: Annotated[list[IPvAnyNetwork], NoDecode] = Field(
        default_factory=lambda: list(DENIED_NETWORKS),
        description="A stream added over the API whose host resolves into one of these "
        "networks is refused (JSON list or ','-separated; [] allows every address). "
        "Default: link-local and cloud metadata addresses.",
    )
    api_host: str = "127.0.0.1"
    api_port: int = Field(8080, ge=0, le=65535)
    listener: ListenerSettings = Field(
        default_factory=ListenerSettings,
        description="The API listener's limits before authentication: connections, header "
        "and keep-alive timeouts, trusted proxies (framerelay.listeners).",
    )
    out: Path | None = Field(None, description="Also append results to this JSON Lines file.")
    results: ResultsSettings = Field(
        default_factory=ResultsSettings, description="Results delivery (hub and Redis)."
    )
    redis_url: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices(
            "redis_url", "FRAMERELAY_REDIS_URL", "FRAMERELAY_INGEST_REDIS_URL"
        ),
        description="redis://... : keep stream definitions (and results) in Redis.",
    )
    store_path: Path = Field(
        Path("framerelay-streams.json"),
        description="Without Redis: the JSON file that keeps streams added over the API.",
    )
    store_key: str = Field(
        "framerelay:ingest:streams",
        min_length=1,
        max_length=200,
        description="Redis hash holding this ingest's stream definitions.",
    )

    shards: ShardSettings = Field(
        default_factory=ShardSettings,
        description="Several ingest replicas on one Redis share the streams (ingest.shards).",
    )
    job_sidecar_dirs: tuple[Path, ...] = Field(
        (),
        description="Directories where job tasks may write their sidecars (a JSON list; "
        "symbolic links resolved): a task whose job.sidecar lies outside them is refused "
        "(docs/jobs.md); empty: this ingest runs no job task.",
    )
    serverless: ServerlessSettings = Field(
        default_factory=ServerlessSettings,
        description="RunPod serverless endpoints for job tasks that name one (the RunPod API "
        "key, API URL, retries, deadlines: ingest.serverless_link).",
    )

    orchestrator_url: str | None = Field(
        None,
        max_length=2048,
        description="The orchestrator's API (https://host:port; http:// only to this host), "
        "read for the console's fleet and jobs panels (GET /v1/console/fleet, /jobs); "
        "unset: no panels.",
    )
    orchestrator_token: SecretStr | None = Field(
        None,
        description="A token for the orchestrator (audience orchestrator, scopes fleet:read "
        "and jobs:read: the console's fleet and jobs panels); "
        "unset: the ingest mints short-lived ones with the private FRAMERELAY_SIGNING_KEYS.",
    )
    orchestrator_ca: Path | None = Field(
        None, description="CA bundle to verify an https:// orchestrator (default: the system's)."
    )
    orchestrator_timeout_s: float = Field(
        2.0, gt=0, le=60, allow_inf_nan=False,
        description="Seconds the orchestrator has to connect and to answer each read; a "
        "panel's refresh fails after twice this (the last data stays, marked stale).",
    )  # fmt: skip

    @field_validator("file_roots", "source_denied_networks", mode="before")
    @classmethod
    def _split_list(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, str):
            return value
        if value.lstrip().startswith("["):
            return json.loads(value)
        sep = ":" if info.field_name == "file_roots" else ","
        return [part.strip() for part in value.split(sep) if part.strip()]

    @field_validator("orchestrator_url")
    @classmethod
    def _check_orchestrator_url(cls, value: str | None) -> str | None:
        problem = orchestrator_url_problem(value) if value is not None else None
        if problem is not None:
            raise ValueError(problem)
        return value.rstrip("/") if value is not None else None

    @model_validator(mode="after")
    def _check_orchestrator(self) -> IngestSettings:
        url = self.orchestrator_url
        if url is None and (self.orchestrator_token or self.orchestrator_ca):
            raise ValueError("FRAMERELAY_INGEST_ORCHESTRATOR_TOKEN and _CA need "
                             "FRAMERELAY_INGEST_ORCHESTRATOR_URL")  # fmt: skip
        if url is not None and self.orchestrator_ca and not url.startswith("https://"):
            raise ValueError("FRAMERELAY_INGEST_ORCHESTRATOR_CA needs an https:// orchestrator")
        keys = self.orchestrator_token or self.signing_keys or self.token_secrets
        if url is not None and keys is None:
            raise ValueError(
                f"FRAMERELAY_INGEST_ORCHESTRATOR_URL needs credentials: {ORCHESTRATOR_TOKEN_ENV} "
                "(audience orchestrator, scopes fleet:read, jobs:read) or "
                "FRAMERELAY_SIGNING_KEYS_FILE (the "
                "private key set, to mint one)"
            )
        return self

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: SecretStr | None) -> SecretStr | None:
        problem = redis_url_problem(value.get_secret_value()) if value is not None else None
        if problem is not None:  # never quotes the password
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _check_shards(self) -> IngestSettings:
        if self.shards.enabled and self.redis_url is None:
            raise ValueError("FRAMERELAY_INGEST_SHARDS__ENABLED needs FRAMERELAY_REDIS_URL "
                             "(the replicas share leases, routes and snapshots there)")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _check_api_tls(self) -> IngestSettings:
        if (self.api_tls_cert is None) != (self.api_tls_key is None):
            raise ValueError("set both api_tls_cert and api_tls_key (or neither)")
        if self.api_tls_client_ca is not None and self.api_tls_cert is None:
            raise ValueError("api_tls_client_ca (mTLS) needs api_tls_cert and api_tls_key")
        return self
