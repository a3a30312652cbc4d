"""The tunnel's wire format: typed messages and a sans-I/O codec.

One WebSocket binary message carries one protocol message::

    +---------+------+----------------+-------------+-----------+
    | version | type | header length  | header JSON |  payload  |
    |  u8     |  u8  | u32 big-endian |  UTF-8      |  bytes    |
    +---------+------+----------------+-------------+-----------+

Headers are small JSON objects validated against a schema; payloads are binary
(a JPEG for frames, packed arrays for results).

**Versions.** ``version`` is the major version of the tunnel protocol the
message is written in, the one both peers agreed on at the WebSocket handshake
(subprotocol ``framerelay.v<N>``, see :mod:`framerelay.protocol.negotiation`):
a message of another version on that connection is a protocol error. Within a
major version changes are additive only (new optional fields), so a **reader
of a peer's message ignores fields it does not know**, while a message built
in code stays strict (unknown keyword arguments are refused). Version 2 (this
one) differs from version 1 in HELLO only: ``features`` (what the worker
supports) instead of v1's ``encodings``; :func:`encode` writes a v1 HELLO in
v1's shape, so a v1 peer's strict reader takes it. Golden bytes of every
message pin both (``tests/framerelay/fixtures/wire``).
**Checks.** Headers are ``msgspec`` structs: :func:`decode` checks every field
of a peer's header in one pass (about 0.6 us for a FRAME, a quarter of what the
pydantic models took), while the class's own constructor checks nothing, for
headers built from values already checked. Values that may be out of range go
through :func:`build` or an ``of`` method (:meth:`Frame.of`, :meth:`Result.of`),
which check every field as a peer would and raise :class:`InvalidMessage`.
``decode`` raises only :class:`ProtocolError`, whatever the bytes. Every number
is bounded and finite: NaN and +-Infinity (which JSON parsers accept as
``NaN``/``Infinity`` or as ``1e400``) are refused in every float field. A FRAME
whose header is invalid but still names a valid stream and seq raises
:class:`FrameError`, so a server can answer that one frame and keep the tunnel.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal, NoReturn, TypeVar

import msgspec
from msgspec import Meta, Struct

from framerelay.errors import ProtocolError
from framerelay.stream_ids import KNOWN as _KNOWN_IDS
from framerelay.stream_ids import STREAM_ID as STREAM_ID  # re-exported: the one pattern
from framerelay.stream_ids import STREAM_ID_RE, is_valid, reason
from framerelay.wire_diagnose import frame_identity, lenient_reason, readable
from framerelay.wire_envelope import DEFAULT_LIMITS as DEFAULT_LIMITS
from framerelay.wire_envelope import PREFIX as PREFIX
from framerelay.wire_envelope import CloseCode as CloseCode
from framerelay.wire_envelope import Limits as Limits
from framerelay.wire_envelope import MsgType as MsgType
from framerelay.wire_models import MAX_MODELS as MAX_MODELS
from framerelay.wire_models import ModelInfo as ModelInfo
from framerelay.wire_models import ModelName as _ModelName
from framerelay.wire_payload import pack_detections as pack_detections
from framerelay.wire_payload import unpack_detections as unpack_detections

VERSION = 2
"""The major version this codec writes by default (and the newest it reads)."""
SUPPORTED_VERSIONS = (2, 1)
"""Versions this codec reads and writes, newest first."""
_PREFIX_SIZE = PREFIX.size
_unpack_prefix = PREFIX.unpack_from
_pack_prefix = PREFIX.pack
MAX_SCALE = 64.0
"""The largest letterbox scale a FRAME carries."""
MAX_SIDE = 16_384
"""The largest source side a FRAME carries."""
PTS_LIMIT = 2**62
"""A FRAME's ``pts`` is in ``[-PTS_LIMIT, PTS_LIMIT)``."""
MAX_CAPTURED_AT = 1e11
"""``captured_at`` is Unix time in seconds: 0 <= t < 1e11 (the year 5138)."""
MAX_CLOCK_S = 1e30
"""Bound of a session clock's seconds (PTS times reach about 1e28: 2**62 x 2**31)."""


class FrameError(ProtocolError):
    """A FRAME whose header is invalid, but whose ``stream_id`` and ``seq`` are readable.

    A server answers that frame with an ERROR (code ``bad_frame``), which returns
    the sender's credit, instead of closing the whole tunnel.
    """

    def __init__(self, message: str, *, stream_id: str, seq: int) -> None:
        super().__init__(message)
        self.stream_id = stream_id
        self.seq = seq


_SID = Annotated[str, Meta(min_length=1, max_length=128)]
"""A stream id: its length here, its pattern (:data:`STREAM_ID`) by :func:`decode` and
:func:`build` after msgspec (:mod:`framerelay.stream_ids`: cached, a lookup per header)."""
_U63 = Annotated[int, Meta(ge=0, le=2**63 - 1)]
_TB = Annotated[int, Meta(gt=0, le=2**31)]


class InvalidMessage(ValueError):
    """A message built in code breaks its schema (:func:`build`, the ``of`` methods):
    e.g. the scale of a 1x1 source, or a non-finite clock."""


class _Header(Struct, frozen=True, kw_only=True, gc=False):
    """A message header: a ``msgspec`` struct. Constructing one checks nothing (decoded
    headers are checked by :func:`decode`); build one from values that may be out of
    range with :func:`build` or an ``of`` method, which check every field.

    Not tracked by the garbage collector (``gc=False``): a header holds only values
    (strings, numbers, lists, a dict of floats, a clock) and can never be part of a
    reference cycle, and two are made per frame on each side (``bench/tunnel.py``:
    about 1 us of CPU per frame per side less)."""

    TYPE: ClassVar[MsgType]


class Hello(_Header, frozen=True, kw_only=True):
    """Worker -> ingest, first message after the upgrade.

    ``models`` (optional, added within version 2, written only when set and never on
    v1) lists the models a stream may name in OPEN; ``class_names`` and the input size
    are those of the worker's default model."""

    TYPE: ClassVar[MsgType] = MsgType.HELLO
    worker_id: Annotated[str, Meta(max_length=128)]
    input_w: Annotated[int, Meta(gt=0, le=8192)]
    input_h: Annotated[int, Meta(gt=0, le=8192)]
    class_names: Annotated[list[str], Meta(max_length=10_000)]
    providers: Annotated[list[str], Meta(max_length=16)]
    max_inflight: Annotated[int, Meta(ge=1, le=1024)]
    features: Annotated[list[Annotated[str, Meta(max_length=64)]], Meta(max_length=64)] = (
        msgspec.field(default_factory=list)
    )
    """What the worker supports beyond the version's core (see
    :mod:`framerelay.protocol.negotiation`); unknown names are ignored."""
    models: Annotated[list[ModelInfo], Meta(max_length=MAX_MODELS)] | msgspec.UnsetType = (
        msgspec.UNSET
    )

    def model(self, name: str | None) -> ModelInfo | None:
        """The model ``name`` as this HELLO lists it (None: not listed, or no name)."""
        if name is None or isinstance(self.models, msgspec.UnsetType):
            return None
        return next((m for m in self.models if m.name == name), None)

    def class_names_of(self, model: str | None) -> list[str]:
        """The class names of a RESULT of ``model``: the default model's for None, none
        for a model this HELLO does not list (its classes are then named by number)."""
        if model is None:
            return self.class_names
        info = self.model(model)
        return [] if info is None else info.class_names


class SessionClock(Struct, frozen=True, kw_only=True):
    """Where a stream session's tracker clock stands (see gpu_worker.sessions)."""

    epoch: _U63 | None = None
    offset: Annotated[float, Meta(ge=-MAX_CLOCK_S, le=MAX_CLOCK_S)] = 0.0
    last_t: Annotated[float, Meta(ge=-1e18, le=MAX_CLOCK_S)] = -1e18
    last_captured: Annotated[float, Meta(ge=0.0, lt=MAX_CAPTURED_AT)] = 0.0


MAX_TRACKER_S = 3600.0
"""Bound of a per-stream tracker time setting (s); the tracker's own bounds may be tighter."""
_TrackerSeconds = Annotated[float, Meta(ge=0.0, le=MAX_TRACKER_S)] | None


class TrackerTimes(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A stream's own tracker time settings (seconds; see tracker/README.md). Each one
    left out (None) keeps the worker's tracker default; only those set are written."""

    max_lost_s: _TrackerSeconds = None
    tentative_max_gap_s: _TrackerSeconds = None
    direction_window_s: _TrackerSeconds = None
    max_gap_s: _TrackerSeconds = None


class Open(_Header, frozen=True, kw_only=True):
    """Ingest -> worker: start (or resume) a stream's session.

    With ``clock`` set, the payload is a tracker snapshot taken by a worker
    (this one or another): the session resumes from it, so track ids continue.
    ``tracker_settings`` (optional, added within version 2: a reader that does not
    know it ignores it) carries the stream's own tracker time settings; it is
    written only when set, so an OPEN without it keeps its bytes, and never on a
    v1 tunnel (a v1 reader refuses unknown fields). ``model`` (optional, the same way)
    names the stream's model; without it the worker's default model serves the stream.
    """

    TYPE: ClassVar[MsgType] = MsgType.OPEN
    stream_id: _SID
    tracker: Annotated[str, Meta(max_length=64)] = "default"
    clock: SessionClock | None = None
    tracker_settings: TrackerTimes | msgspec.UnsetType = msgspec.UNSET
    model: _ModelName | msgspec.UnsetType = msgspec.UNSET

    @property
    def model_name(self) -> str | None:
        """``model``, None when the OPEN names none."""
        return None if isinstance(self.model, msgspec.UnsetType) else self.model

    @property
    def times(self) -> TrackerTimes | None:
        """``tracker_settings``, None when the OPEN has none."""
        times = self.tracker_settings
        return None if isinstance(times, msgspec.UnsetType) else times


class Snapshot(_Header, frozen=True, kw_only=True):
    """Worker -> ingest: the state of a stream's session after frame ``seq``
    (payload: the tracker snapshot). The ingest keeps the latest one and sends
    it back in OPEN when the stream moves to another worker."""

    TYPE: ClassVar[MsgType] = MsgType.SNAPSHOT
    stream_id: _SID
    seq: _U63
    clock: SessionClock


class Close(_Header, frozen=True, kw_only=True):
    """Ingest -> worker: the stream ended; free its session."""

    TYPE: ClassVar[MsgType] = MsgType.CLOSE
    stream_id: _SID


class Timing(_Header, frozen=True, kw_only=True):
    """A frame's timing, the one type of it from decode to result.

    The ingest stamps it once (``ingest.stream.Outgoing``); FRAME and RESULT carry
    it unchanged (:meth:`Frame.of`, :meth:`Result.of`) and the result record
    copies it (:meth:`framerelay.results.ResultRecord.build`).
    """

    stream_id: _SID
    epoch: _U63
    seq: _U63
    pts: Annotated[int, Meta(ge=-PTS_LIMIT, lt=PTS_LIMIT)]
    time_base: tuple[_TB, _TB]
    captured_at: Annotated[float, Meta(ge=0.0, lt=MAX_CAPTURED_AT)]

    @property
    def pts_time(self) -> float:
        num, den = self.time_base
        return self.pts * num / den

    def timing_fields(self) -> dict[str, Any]:
        """The timing fields by name (those of :class:`Timing`, not a subclass's)."""
        return {
            "stream_id": self.stream_id, "epoch": self.epoch, "seq": self.seq, "pts": self.pts,
            "time_base": self.time_base, "captured_at": self.captured_at,
        }  # fmt: skip


TIMING_FIELDS: tuple[str, ...] = Timing.__struct_fields__
"""The names of a frame's timing fields, in wire order."""


class Frame(Timing, frozen=True, kw_only=True):
    """Ingest -> worker: one encoded, letterboxed frame (payload: the image)."""

    TYPE: ClassVar[MsgType] = MsgType.FRAME
    encoding: Literal["jpeg"] = "jpeg"
    src_w: Annotated[int, Meta(gt=0, le=MAX_SIDE)]
    src_h: Annotated[int, Meta(gt=0, le=MAX_SIDE)]
    scale: Annotated[float, Meta(gt=0.0, le=MAX_SCALE)]

    @classmethod
    def of(cls, timing: Timing, *, src_w: int, src_h: int, scale: float) -> Frame:
        """The FRAME of the frame ``timing`` stamps (:class:`InvalidMessage` for a value
        the wire refuses, e.g. the scale of a 1x1 source)."""
        fields = timing.timing_fields()
        fields.update(src_w=src_w, src_h=src_h, scale=scale)
        return _checked(cls, fields)


TIMING_MS_LIMIT = 1e12
"""A RESULT's timings are within +-this many ms."""
MAX_TIMINGS = 32
"""A RESULT carries at most this many timings."""
MAX_DETECTIONS_FIELD = 2**31
"""A RESULT's ``n`` is below this (the payload's own limit is :attr:`Limits.max_detections`)."""
_TimingMs = Annotated[float, Meta(ge=-TIMING_MS_LIMIT, le=TIMING_MS_LIMIT)]


class Result(Timing, frozen=True, kw_only=True):
    """Worker -> ingest: detections of one frame (payload: packed arrays). ``model``
    (optional within version 2, never on v1) names the model that found them."""

    TYPE: ClassVar[MsgType] = MsgType.RESULT
    n: Annotated[int, Meta(ge=0, lt=MAX_DETECTIONS_FIELD)]
    timings: Annotated[dict[str, _TimingMs], Meta(max_length=MAX_TIMINGS)] = msgspec.field(
        default_factory=dict
    )
    model: _ModelName | msgspec.UnsetType = msgspec.UNSET

    @property
    def model_name(self) -> str | None:
        return None if isinstance(self.model, msgspec.UnsetType) else self.model

    @classmethod
    def of(
        cls,
        frame: Timing,
        *,
        n: int,
        timings: dict[str, float] | None = None,
        model: str | msgspec.UnsetType = msgspec.UNSET,
    ) -> Result:
        """The RESULT answering ``frame``: its timing echoed unchanged (:class:`InvalidMessage`
        for a count or timing out of range). ``frame`` is a checked header (decoded or
        built), so only ``n`` and ``timings`` are checked here: the answer to every frame
        takes this path, and a full check costs as much as the rest of the reply."""
        timings = timings or {}
        if not _plain_counts(n, timings):
            fields = frame.timing_fields()
            fields.update(n=n, timings=timings, model=model)
            return _checked(cls, fields)
        return cls(
            stream_id=frame.stream_id, epoch=frame.epoch, seq=frame.seq, pts=frame.pts,
            time_base=frame.time_base, captured_at=frame.captured_at, n=n, timings=timings,
            model=model,
        )  # fmt: skip


def _plain_counts(n: int, timings: dict[str, float]) -> bool:
    """``n`` and ``timings`` within :class:`Result`'s bounds (the common case, checked
    without building a dict for msgspec)."""
    if type(n) is not int or not 0 <= n < MAX_DETECTIONS_FIELD or len(timings) > MAX_TIMINGS:
        return False
    for key, value in timings.items():
        if type(key) is not str or type(value) is not float:
            return False
        if not -TIMING_MS_LIMIT <= value <= TIMING_MS_LIMIT:  # False for NaN too
            return False
    return True


class Error(_Header, frozen=True, kw_only=True):
    """Either way: something went wrong with one frame or the connection."""

    TYPE: ClassVar[MsgType] = MsgType.ERROR
    code: Annotated[str, Meta(max_length=64)]
    message: Annotated[str, Meta(max_length=2000)]
    stream_id: _SID | None = None
    seq: _U63 | None = None


Header = Hello | Open | Close | Frame | Result | Error | Snapshot
_BY_TYPE: dict[int, type[_Header]] = {
    m.TYPE: m for m in (Hello, Open, Close, Frame, Result, Error, Snapshot)
}


_H = TypeVar("_H", bound=Struct)
_ENCODER = msgspec.json.Encoder()
_DECODERS: dict[int, msgspec.json.Decoder[Any]] = {
    mtype: msgspec.json.Decoder(model) for mtype, model in _BY_TYPE.items()
}


def build(cls: type[_H], **fields: Any) -> _H:
    """A ``cls`` built from ``fields`` with every field checked, as :func:`decode` checks
    a peer's (nested structs may be given as dicts). Raises :class:`InvalidMessage` for
    a value out of range or of the wrong type, and for a field ``cls`` does not have."""
    unknown = set(fields) - set(cls.__struct_fields__)
    if unknown:
        raise InvalidMessage(f"{cls.__name__} has no field {', '.join(sorted(unknown))}")
    return _checked(cls, fields)


def _checked(cls: type[_H], fields: dict[str, Any]) -> _H:
    try:
        built = msgspec.convert(fields, cls)
    except msgspec.ValidationError as exc:
        raise InvalidMessage(f"invalid {cls.__name__}: {readable(exc)}") from None
    sid = getattr(built, "stream_id", None)
    if sid is not None and not is_valid(sid):
        raise InvalidMessage(f"invalid {cls.__name__}: {reason(sid)}")
    return built


def encode(
    header: Header, payload: bytes = b"", limits: Limits = DEFAULT_LIMITS, *, version: int = VERSION
) -> bytes:
    """Serialise one message in protocol ``version``. Raises ProtocolError if it breaks
    a limit, ValueError for a version this codec does not write."""
    head = _ENCODER.encode(header) if version == VERSION else _header_json(header, version)
    if len(head) > limits.max_header or len(payload) > limits.max_payload:
        _too_big(len(head), len(payload), limits)
    return _pack_prefix(version, header.TYPE, len(head)) + head + payload


def _too_big(head: int, payload: int, limits: Limits) -> NoReturn:
    if head > limits.max_header:
        raise ProtocolError(
            f"header of {head} B exceeds {limits.max_header} B", close_code=CloseCode.TOO_BIG
        )
    raise ProtocolError(
        f"payload of {payload} B exceeds {limits.max_payload} B", close_code=CloseCode.TOO_BIG
    )


_V2_ONLY: dict[type[_Header], tuple[str, ...]] = {
    Open: ("tracker_settings", "model"),
    Result: ("model",),
}
"""Optional fields added within version 2: left out of a v1 message (v1 reads strictly)."""


def _header_json(header: Header, version: int) -> bytes:
    if version == 1 and type(header) in _V2_ONLY:
        unset = dict.fromkeys(_V2_ONLY[type(header)], msgspec.UNSET)
        header = msgspec.structs.replace(header, **unset)
    if version == VERSION or (version in SUPPORTED_VERSIONS and not isinstance(header, Hello)):
        return _ENCODER.encode(header)
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"protocol version {version} is not one of {SUPPORTED_VERSIONS}")
    fields = msgspec.to_builtins(header)
    del fields["features"]
    fields.pop("models", None)
    fields["encodings"] = ["jpeg"]  # v1's HELLO requires it (a strict reader)
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode()


def decode(
    data: bytes, limits: Limits = DEFAULT_LIMITS, *, version: int = VERSION
) -> tuple[Header, bytes]:
    """Parse and validate one message of protocol ``version`` into (header, payload).

    Fields the header's schema does not know are ignored (a newer peer's additions)."""
    header, end = _decode(data, limits, version)
    return header, data[end:]


def decode_view(
    data: bytes, limits: Limits = DEFAULT_LIMITS, *, version: int = VERSION
) -> tuple[Header, memoryview]:
    """:func:`decode`, with the payload as a view into ``data`` instead of a copy (a
    FRAME's JPEG is tens of KB: the copy costs as much as checking the header)."""
    header, end = _decode(data, limits, version)
    return header, memoryview(data)[end:]


def _decode(data: bytes, limits: Limits, version: int) -> tuple[Header, int]:
    size = len(data)
    if size < _PREFIX_SIZE:
        raise ProtocolError(f"message of {size} B is shorter than the {_PREFIX_SIZE} B prefix")
    got, mtype, hlen = _unpack_prefix(data)
    decoder = _DECODERS.get(mtype) if got == version else None
    end = _PREFIX_SIZE + hlen
    if decoder is None or hlen > limits.max_header or size < end or size - end > limits.max_payload:
        _refuse(got, mtype, hlen, size, limits, version)
    try:
        header: Header = decoder.decode(data[_PREFIX_SIZE:end])
    except (msgspec.DecodeError, RecursionError) as exc:
        _refuse_header(mtype, data[_PREFIX_SIZE:end], exc)
    sid = getattr(header, "stream_id", None)
    if sid is not None and sid not in _KNOWN_IDS and not is_valid(sid):
        raise ProtocolError(f"invalid {type(header).__name__} header: {reason(sid)}")
    return header, end


def _refuse(got: int, mtype: int, hlen: int, size: int, limits: Limits, version: int) -> NoReturn:
    """The ProtocolError of a message whose prefix is wrong (out of the hot path)."""
    if got != version:
        raise ProtocolError(
            f"message of protocol version {got} on a tunnel that agreed on version {version}"
        )
    if mtype not in _BY_TYPE:
        raise ProtocolError(f"unknown message type {mtype}")
    end = _PREFIX_SIZE + hlen
    if hlen <= limits.max_header and size < end:
        raise ProtocolError(
            f"truncated message: header says {hlen} B, {size - _PREFIX_SIZE} B present"
        )
    _too_big(hlen, size - end, limits)


def _refuse_header(mtype: int, raw: bytes, exc: Exception) -> NoReturn:
    """The ProtocolError (a FrameError where the FRAME names itself) of a header that
    does not decode or breaks its schema."""
    model = _BY_TYPE[mtype]
    if isinstance(exc, msgspec.ValidationError):
        message = f"invalid {model.__name__} header: {readable(exc)}"
    elif isinstance(exc, RecursionError):
        message = f"invalid {model.__name__} header: nested too deeply"
    else:
        message = f"invalid {model.__name__} header: {lenient_reason(model, raw) or exc}"
    ident = frame_identity(raw, STREAM_ID_RE) if model is Frame else None
    if ident is not None:
        raise FrameError(message, stream_id=ident[0], seq=ident[1])
    raise ProtocolError(message)
