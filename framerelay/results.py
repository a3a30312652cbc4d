"""The result record apps receive (WebSocket API, Redis, JSON Lines).

A result carries exactly the frame's timing fields back: ``stream_id``,
``epoch``, ``seq``, ``pts``, ``time_base`` (so ``pts_time``), and
``captured_at`` on the ingest clock. Align results with video by
``(stream_id, epoch, pts)``, never by wall-clock time.

``id`` is the result's durable id, a :class:`ResultId` written ``"<ms>-<n>"``
(a Redis Stream entry id): the ingest's result bus settles it once, before any
fan-out, increasing per stream, and the same id names the result on the
WebSocket API, in Redis and in recording sidecars.

Version policy: ``v`` is the schema version. Within a version changes are
additive only (new optional fields); removing or retyping a field bumps it.
So readers ignore fields they do not know: these models are built by the
ingest in code and *read* by peers that may be older or newer
(``extra="ignore"``); API inputs (:class:`framerelay.schemas.Subscription`)
stay strict. The JSON Schema and AsyncAPI documents in ``docs/schemas`` are
generated from these models (``python -m framerelay.schemas --write``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from framerelay import wire
from framerelay.detections import Detections

SCHEMA_VERSION = 1
ID_PATTERN = r"^[0-9]+-[0-9]+$"
_ID_PART_MAX = 2**64 - 1  # a Redis Stream id is two unsigned 64-bit numbers
_ID_DIGITS = 20


@dataclass(frozen=True, slots=True, order=True)
class ResultId:
    """A result's durable id: ``ms`` (Unix milliseconds when settled) and ``seq`` (its
    number within that millisecond). Ordered like Redis Stream ids; written ``"<ms>-<seq>"``
    in JSON, in Redis and in query strings (``str(rid)``, :meth:`parse`)."""

    ms: int
    seq: int = 0

    def __post_init__(self) -> None:
        for name, value in (("ms", self.ms), ("seq", self.seq)):
            if not 0 <= value <= _ID_PART_MAX:
                raise ValueError(f"result id {name}={value} is outside 0..2**64-1")

    @classmethod
    def parse(cls, text: str) -> ResultId:
        """``"<ms>-<seq>"`` -> :class:`ResultId`; ValueError naming the bad text."""
        ms, sep, seq = text.partition("-")
        if not (sep and ms.isascii() and ms.isdigit() and seq.isascii() and seq.isdigit()
                and len(ms) <= _ID_DIGITS and len(seq) <= _ID_DIGITS):  # fmt: skip
            raise ValueError(f"malformed result id {text[:40]!r}: expected '<ms>-<seq>'")
        return cls(int(ms), int(seq))

    def successor(self) -> ResultId:
        """The smallest id above this one."""
        return ResultId(self.ms, self.seq + 1)

    def __str__(self) -> str:
        return f"{self.ms}-{self.seq}"

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: type[Any], handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            _coerce_id, serialization=core_schema.to_string_ser_schema()
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {"pattern": ID_PATTERN, "type": "string"}


def _coerce_id(value: object) -> ResultId:
    if isinstance(value, ResultId):
        return value
    if isinstance(value, str):
        return ResultId.parse(value)
    raise ValueError(f"a result id is a string '<ms>-<seq>', not {type(value).__name__}")


class DetectionOut(BaseModel):
    """One detected object."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    box: tuple[float, float, float, float] = Field(description="x1, y1, x2, y2 in source pixels")
    confidence: float
    class_id: int
    class_name: str
    tracker_id: int = Field(description="Track id (>= 1), or -1 when untracked")


class ResultRecord(BaseModel):
    """Detections of one source frame, with that frame's timing."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    v: int = Field(SCHEMA_VERSION, description="Schema version")
    id: ResultId | None = Field(
        None, description="Durable id '<ms>-<n>', increasing per stream (None before publishing)"
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
    model: str | None = Field(
        None, description="The model that found the detections (None: the worker's default)"
    )
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
        """The record of ``header``'s frame: its timing copied unchanged, ``det`` named."""
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
            **header.timing_fields(),
            pts_time=header.pts_time,
            received_at=received_at,
            latency_ms=round((received_at - header.captured_at) * 1000, 3),
            worker_id=worker_id,
            model=header.model_name,
            detections=items,
            timings=timings,
        )
