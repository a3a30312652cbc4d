"""The tunnel codec of protocol version 1, exactly as released (framerelay/wire.py at
commit 94666b0), kept as a test fixture: a v1 peer's strict reader and writer.

Compatibility tests use it as the other end: what this code sends on a v1 tunnel
must decode here (unknown fields refused, version byte 1 only), and what a v1
peer wrote must decode in the current codec. Frozen: never edit it.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Annotated, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from framerelay.detections import Detections
from framerelay.errors import ProtocolError

VERSION = 1
PREFIX = struct.Struct(">BBI")
STREAM_ID = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
MAX_SCALE = 64.0
"""The largest letterbox scale a FRAME carries."""
MAX_SIDE = 16_384
"""The largest source side (and padding) a FRAME carries."""
PTS_LIMIT = 2**62
"""A FRAME's ``pts`` is in ``[-PTS_LIMIT, PTS_LIMIT)``."""
CLOSE_PROTOCOL = 1002
CLOSE_TOO_BIG = 1009
CLOSE_POLICY = 1008
MAX_CAPTURED_AT = 1e11
"""``captured_at`` is Unix time in seconds: 0 <= t < 1e11 (the year 5138)."""
MAX_CLOCK_S = 1e30
"""Bound of a session clock's seconds (PTS times reach about 1e28: 2**62 x 2**31)."""
_STREAM_ID_RE = re.compile(STREAM_ID)


@dataclass(frozen=True, slots=True)
class Limits:
    """Hard size limits; anything larger is refused before parsing."""

    max_header: int = 16 * 1024
    max_payload: int = 8 * 1024 * 1024
    max_detections: int = 10_000

    @property
    def max_message(self) -> int:
        """What to give ``websockets`` as ``max_size``."""
        return PREFIX.size + self.max_header + self.max_payload


DEFAULT_LIMITS = Limits()


class MsgType(IntEnum):
    HELLO = 1
    OPEN = 2
    CLOSE = 3
    FRAME = 4
    RESULT = 5
    ERROR = 6
    SNAPSHOT = 7


class FrameError(ProtocolError):
    """A FRAME whose header is invalid, but whose ``stream_id`` and ``seq`` are readable.

    A server answers that frame with an ERROR (code ``bad_frame``), which returns
    the sender's credit, instead of closing the whole tunnel.
    """

    def __init__(self, message: str, *, stream_id: str, seq: int) -> None:
        super().__init__(message)
        self.stream_id = stream_id
        self.seq = seq


_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class _Header(BaseModel):
    model_config = _STRICT
    TYPE: ClassVar[MsgType]


class Hello(_Header):
    """Worker -> ingest, first message after the upgrade."""

    TYPE: ClassVar[MsgType] = MsgType.HELLO
    worker_id: str = Field(max_length=128)
    input_w: int = Field(gt=0, le=8192)
    input_h: int = Field(gt=0, le=8192)
    class_names: list[str] = Field(max_length=10_000)
    providers: list[str] = Field(max_length=16)
    max_inflight: int = Field(ge=1, le=1024)
    encodings: list[str] = Field(max_length=8)


class SessionClock(BaseModel):
    """Where a stream session's tracker clock stands (see gpu_worker.sessions)."""

    model_config = _STRICT
    epoch: int | None = Field(None, ge=0, lt=2**63)
    offset: float = Field(0.0, ge=-MAX_CLOCK_S, le=MAX_CLOCK_S)
    last_t: float = Field(-1e18, ge=-1e18, le=MAX_CLOCK_S)
    last_captured: float = Field(0.0, ge=0.0, lt=MAX_CAPTURED_AT)


class Open(_Header):
    """Ingest -> worker: start (or resume) a stream's session.

    With ``clock`` set, the payload is a tracker snapshot taken by a worker
    (this one or another): the session resumes from it, so track ids continue.
    """

    TYPE: ClassVar[MsgType] = MsgType.OPEN
    stream_id: str = Field(pattern=STREAM_ID)
    tracker: str = Field("default", max_length=64)
    clock: SessionClock | None = None


class Snapshot(_Header):
    """Worker -> ingest: the state of a stream's session after frame ``seq``
    (payload: the tracker snapshot). The ingest keeps the latest one and sends
    it back in OPEN when the stream moves to another worker."""

    TYPE: ClassVar[MsgType] = MsgType.SNAPSHOT
    stream_id: str = Field(pattern=STREAM_ID)
    seq: int = Field(ge=0, lt=2**63)
    clock: SessionClock


class Close(_Header):
    """Ingest -> worker: the stream ended; free its session."""

    TYPE: ClassVar[MsgType] = MsgType.CLOSE
    stream_id: str = Field(pattern=STREAM_ID)


class Timing(_Header):
    """PTS timing carried unchanged from frame to result."""

    stream_id: str = Field(pattern=STREAM_ID)
    epoch: int = Field(ge=0, lt=2**63)
    seq: int = Field(ge=0, lt=2**63)
    pts: int = Field(ge=-PTS_LIMIT, lt=PTS_LIMIT)
    time_base: tuple[int, int]
    captured_at: float = Field(ge=0.0, lt=MAX_CAPTURED_AT)

    @property
    def pts_time(self) -> float:
        num, den = self.time_base
        return self.pts * num / den


class Frame(Timing):
    """Ingest -> worker: one encoded, letterboxed frame (payload: the image)."""

    TYPE: ClassVar[MsgType] = MsgType.FRAME
    encoding: Literal["jpeg"] = "jpeg"
    src_w: int = Field(gt=0, le=MAX_SIDE)
    src_h: int = Field(gt=0, le=MAX_SIDE)
    scale: float = Field(gt=0.0, le=MAX_SCALE)
    pad_x: int = Field(0, ge=0, le=MAX_SIDE)
    pad_y: int = Field(0, ge=0, le=MAX_SIDE)


TimingMs = Annotated[float, Field(ge=-1e12, le=1e12, allow_inf_nan=False)]


class Result(Timing):
    """Worker -> ingest: detections of one frame (payload: packed arrays)."""

    TYPE: ClassVar[MsgType] = MsgType.RESULT
    n: int = Field(ge=0, lt=2**31)
    timings: dict[str, TimingMs] = Field(default_factory=dict, max_length=32)


class Error(_Header):
    """Either way: something went wrong with one frame or the connection."""

    TYPE: ClassVar[MsgType] = MsgType.ERROR
    code: str = Field(max_length=64)
    message: str = Field(max_length=2000)
    stream_id: str | None = Field(None, pattern=STREAM_ID)
    seq: int | None = Field(None, ge=0, lt=2**63)


Header = Hello | Open | Close | Frame | Result | Error | Snapshot
_BY_TYPE: dict[int, type[_Header]] = {
    m.TYPE: m for m in (Hello, Open, Close, Frame, Result, Error, Snapshot)
}


def _check_time_base(header: _Header) -> None:
    if isinstance(header, Timing):
        num, den = header.time_base
        if num <= 0 or den <= 0 or num > 2**31 or den > 2**31:
            message = f"time_base must be two positive int32s, got {header.time_base}"
            if isinstance(header, Frame):
                raise FrameError(message, stream_id=header.stream_id, seq=header.seq)
            raise ProtocolError(message)


def encode(header: Header, payload: bytes = b"", limits: Limits = DEFAULT_LIMITS) -> bytes:
    """Serialise one message. Raises ProtocolError if it breaks a limit."""
    head = header.model_dump_json().encode()
    if len(head) > limits.max_header:
        raise ProtocolError(
            f"header of {len(head)} B exceeds {limits.max_header} B", close_code=CLOSE_TOO_BIG
        )
    if len(payload) > limits.max_payload:
        raise ProtocolError(
            f"payload of {len(payload)} B exceeds {limits.max_payload} B", close_code=CLOSE_TOO_BIG
        )
    return PREFIX.pack(VERSION, header.TYPE, len(head)) + head + payload


def decode(data: bytes, limits: Limits = DEFAULT_LIMITS) -> tuple[Header, bytes]:
    """Parse and validate one message into (header, payload)."""
    if len(data) < PREFIX.size:
        raise ProtocolError(f"message of {len(data)} B is shorter than the {PREFIX.size} B prefix")
    version, mtype, hlen = PREFIX.unpack_from(data)
    if version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version}; this peer speaks {VERSION}")
    model = _BY_TYPE.get(mtype)
    if model is None:
        raise ProtocolError(f"unknown message type {mtype}")
    if hlen > limits.max_header:
        raise ProtocolError(
            f"header of {hlen} B exceeds {limits.max_header} B", close_code=CLOSE_TOO_BIG
        )
    end = PREFIX.size + hlen
    if len(data) < end:
        raise ProtocolError(
            f"truncated message: header says {hlen} B, {len(data) - PREFIX.size} B present"
        )
    if len(data) - end > limits.max_payload:
        raise ProtocolError(
            f"payload of {len(data) - end} B exceeds {limits.max_payload} B",
            close_code=CLOSE_TOO_BIG,
        )
    header = _parse_header(model, data[PREFIX.size : end])
    _check_time_base(header)
    return header, data[end:]  # type: ignore[return-value]


def _parse_header(model: type[_Header], raw: bytes) -> _Header:
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "(header)"
        message = f"invalid {model.__name__} header: {where}: {first['msg']}"
        ident = _frame_identity(raw) if model is Frame else None
        if ident is not None:
            raise FrameError(message, stream_id=ident[0], seq=ident[1]) from None
        raise ProtocolError(message) from None


def _frame_identity(raw: bytes) -> tuple[str, int] | None:
    """(stream_id, seq) of an invalid FRAME header when both are valid, else None."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    stream_id, seq = obj.get("stream_id"), obj.get("seq")
    if not isinstance(stream_id, str) or _STREAM_ID_RE.fullmatch(stream_id) is None:
        return None
    if type(seq) is not int or not 0 <= seq < 2**63:
        return None
    return stream_id, seq


# -- detections payload --------------------------------------------------------

_ROW = 16 + 4 + 4 + 8  # xyxy f32x4, conf f32, class i32, tracker i64


def pack_detections(det: Detections) -> bytes:
    """Little-endian columns: xyxy, confidence, class_id, tracker_id."""
    return b"".join(
        (
            det.xyxy.astype("<f4").tobytes(),
            det.confidence.astype("<f4").tobytes(),
            det.class_id.astype("<i4").tobytes(),
            det.tracker_id.astype("<i8").tobytes(),
        )
    )


def unpack_detections(n: int, payload: bytes, limits: Limits = DEFAULT_LIMITS) -> Detections:
    """Inverse of :func:`pack_detections`; validates counts and values."""
    if n > limits.max_detections:
        raise ProtocolError(f"{n} detections exceed the limit of {limits.max_detections}")
    if len(payload) != n * _ROW:
        raise ProtocolError(
            f"result payload is {len(payload)} B, expected {n * _ROW} B for {n} detections"
        )
    xyxy = np.frombuffer(payload, "<f4", 4 * n, 0).reshape(n, 4)
    conf = np.frombuffer(payload, "<f4", n, 16 * n)
    cls = np.frombuffer(payload, "<i4", n, 20 * n)
    tid = np.frombuffer(payload, "<i8", n, 24 * n)
    try:
        return Detections(xyxy=xyxy, confidence=conf, class_id=cls, tracker_id=tid)
    except ValueError as exc:
        raise ProtocolError(f"invalid detections in result: {exc}") from None
