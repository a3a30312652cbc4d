"""Recording worker settings (env prefix ``FRAMERELAY_RECORD_``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import SettingsConfigDict

from framerelay.settings import ServiceSettings
from framerelay.wire import STREAM_ID


class RecorderSettings(ServiceSettings):
    """What to record, where, and how long to keep it."""

    model_config = SettingsConfigDict(
        env_prefix="FRAMERELAY_RECORD_",
        extra="forbid",
        hide_input_in_errors=True,
        allow_inf_nan=False,
    )

    stream_id: str = Field(pattern=STREAM_ID, description="The stream whose results to align.")
    source: str = Field(
        min_length=1, description="The camera URL (or file) to record; credentials never logged."
    )
    realtime: bool = Field(
        True,
        description="Read a local file at its frame rate (as a camera would send it), so its "
        "recording's wall clock matches the capture times of the ingest's results.",
    )
    loop: bool = Field(
        False,
        description="Start a local file over at its end (a new epoch each pass), as the "
        "ingest's loop; without it a file is recorded once and the recorder stops.",
    )
    out_dir: Path = Field(Path("recordings"), description="Segments, sidecars and the index.")
    segment_s: float = Field(
        10.0, gt=0, le=3600, description="Segment length (cut at the next keyframe after it)."
    )
    retention_s: float = Field(
        86_400.0,
        gt=0,
        le=10 * 366 * 86_400,
        description="Segments (and sidecars) older than this are deleted.",
    )
    max_bytes: int = Field(
        0, ge=0, le=2**62, description="Keep at most this many bytes (0: no limit)."
    )
    redis_url: SecretStr = Field(
        validation_alias=AliasChoices("redis_url", "FRAMERELAY_REDIS_URL"),
        description="Redis holding the durable results (FRAMERELAY_REDIS_URL).",
    )
    redis_prefix: str = Field("framerelay", pattern=r"^[A-Za-z0-9._:-]{1,64}$")
    group: str = Field("recorder", min_length=1, max_length=64, description="Consumer group.")
    consumer: str | None = Field(
        None, max_length=128, description="Consumer name (default record-<stream_id>)."
    )
    claim_idle_s: float = Field(
        30.0, gt=0, le=86_400, description="Claim other consumers' entries pending this long."
    )
    open_timeout_s: float = Field(10.0, gt=0, le=300, description="Camera open timeout.")
    read_timeout_s: float = Field(10.0, gt=0, le=300, description="Camera read timeout.")
    reconnect_max_s: float = Field(10.0, gt=0, le=600, description="Camera reconnect backoff cap.")
    analyze_s: float = Field(
        1.0, gt=0, le=30, description="How long FFmpeg probes a live source before recording."
    )
    match_window_s: float = Field(
        10.0, gt=0, le=600,
        description="A result is looked for among frames recorded within this many seconds "
        "of its capture time; past that without a frame it goes to a gap file.",
    )  # fmt: skip
    pending_max: int = Field(
        20_000, ge=1, le=10_000_000, description="Results waiting for their frame, at most."
    )

    @property
    def is_file(self) -> bool:
        """A local file (ends: recorded once, or looped), not a camera (reconnected)."""
        scheme, sep, _ = self.source.partition("://")
        return not sep or scheme.lower() == "file"

    @property
    def consumer_name(self) -> str:
        return self.consumer or f"record-{self.stream_id}"
