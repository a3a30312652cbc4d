"""The result record apps receive (WebSocket API, Redis, JSON Lines).

A result carries exactly the frame's timing fields back: ``stream_id``,
``epoch``, ``seq``, ``pts``, ``time_base`` (so ``pts_time``), and
``captured_at`` on the ingest clock. Align results with video by
``(stream_id, epoch, pts)``, never by wall-clock time.

``id`` is the result's durable id, ``"<ms>-<n>"`` (a Redis Stream entry id):
the ingest's result bus assigns it, increasing per stream, and the same id
names the result on the WebSocket API, in Redis and in recording sidecars.

Version policy: ``v`` is the schema version. Within a version changes are
additive only (new optional fields); removing or retyping a field bumps it.
The JSON Schema and AsyncAPI documents in ``docs/schemas`` are generated from
these models (``python -m framerelay.schemas --write``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from framerelay import wire
from framerelay.detections import Detections

SCHEMA_VERSION = 1


class DetectionOut(BaseModel):
    """One detected object."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    box: tuple[float, float, float, float] = Field(description="x1, y1, x2, y2 in source pixels")
    confidence: float
    class_id: int
    class_name: str
    tracker_id: int = Field(description="Track id (>= 1), or -1 when untracked")


class ResultRecord(BaseModel):
    """Detections of one source frame, with that frame's timing."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    v: int = Field(SCHEMA_VERSION, description="Schema version")
    id: str | None = Field(
        None,
        pattern=r"^[0-9]+-[0-9]+$",
        description="Durable id '<ms>-<n>', increasing per stream (None before publishing)",
    )
    stream_id: str
    epoch: int
    seq: int
    pts: int
    time_base: tuple[int, int]
    pts_time: float = Field(description="pts x time_base, seconds on the source's clock")
    captured_at: float = Field(description="Unix time the ingest decoded the frame")
    received_at: float = Field(description="Unix time the ingest received the result")
    latency_ms: float = Field(description="received_at - captured_at")
    worker_id: str
    detections: list[DetectionOut]
    timings: dict[str, float] = Field(default_factory=dict, description="Per-stage ms")

    @classmethod
    def build(
        cls,
        header: wire.Result,
        det: Detections,
        *,
        class_names: Sequence[str],
        worker_id: str,
        received_at: float,
        extra_timings: dict[str, float] | None = None,
    ) -> ResultRecord:
        names = [
            class_names[c] if 0 <= c < len(class_names) else str(c) for c in det.class_id.tolist()
        ]
        items = [
            DetectionOut(
                box=(round(b[0], 2), round(b[1], 2), round(b[2], 2), round(b[3], 2)),
                confidence=round(c, 4),
                class_id=k,
                class_name=n,
                tracker_id=t,
            )
            for b, c, k, n, t in zip(
                det.xyxy.tolist(),
                det.confidence.tolist(),
                det.class_id.tolist(),
                names,
                det.tracker_id.tolist(),
                strict=True,
            )
        ]
        timings = {k: round(v, 3) for k, v in {**header.timings, **(extra_timings or {})}.items()}
        return cls(
            stream_id=header.stream_id,
            epoch=header.epoch,
            seq=header.seq,
            pts=header.pts,
            time_base=header.time_base,
            pts_time=header.pts_time,
            captured_at=header.captured_at,
            received_at=received_at,
            latency_ms=round((received_at - header.captured_at) * 1000, 3),
            worker_id=worker_id,
            detections=items,
            timings=timings,
        )
