"""Why a tunnel header was refused, in words (out of :mod:`framerelay.wire`'s hot path).

:func:`readable` turns msgspec's ``what - at `$.field` `` into ``field: what``;
:func:`lenient_reason` names the field of a header that is not strict JSON
(``NaN``, ``Infinity``); :func:`frame_identity` finds the stream and seq of an
invalid FRAME, so the worker can refuse that frame alone.
"""

from __future__ import annotations

import json
import re

import msgspec
from msgspec import Struct

_PATH = re.compile(r"\[(\d+)\]|\[\.\.\.\]|\.")


def readable(exc: msgspec.ValidationError) -> str:
    """``field.sub: what`` from msgspec's ``what - at `$.field.sub` ``."""
    text = str(exc)
    what, sep, where = text.rpartition(" - at `$")
    if not sep:
        return text
    path = _PATH.sub(lambda m: f".{m.group(1)}" if m.group(1) else ".", where.rstrip("`"))
    return f"{path.strip('.') or '(header)'}: {what}"


def lenient_reason(model: type[Struct], raw: bytes) -> str | None:
    """Which field is wrong in a header that is not strict JSON but Python's reader takes
    (``NaN``, ``Infinity``): msgspec's own message only gives the byte offset."""
    try:
        msgspec.convert(json.loads(raw), model)
    except msgspec.ValidationError as exc:
        return readable(exc)
    except (ValueError, RecursionError):
        pass
    return None


def frame_identity(raw: bytes, stream_id_re: re.Pattern[str]) -> tuple[str, int] | None:
    """(stream_id, seq) of an invalid FRAME header when both are valid, else None."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    stream_id, seq = obj.get("stream_id"), obj.get("seq")
    if not isinstance(stream_id, str) or stream_id_re.fullmatch(stream_id) is None:
        return None
    if type(seq) is not int or not 0 <= seq < 2**63:
        return None
    return stream_id, seq
