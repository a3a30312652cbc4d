"""Stream ids: the one pattern, and a check that costs a dict lookup for an id seen before.

Every tunnel header that names a stream is checked against :data:`STREAM_ID`.
A regular-expression match costs about half a microsecond, as much as decoding
the rest of a FRAME header, and a tunnel sees the same few ids thousands of
times a second; so ids that matched are remembered (at most :data:`KNOWN_MAX`,
the memory is then cleared and refilled) and the next check is a set lookup.
"""

from __future__ import annotations

import re

STREAM_ID = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
"""Letters, digits and ``._:-``, 1-128 characters, starting with a letter or digit."""
MAX_LENGTH = 128
STREAM_ID_RE = re.compile(STREAM_ID)
KNOWN_MAX = 4096
"""Ids remembered as valid; beyond this the memory starts again (bounded, whatever a
peer sends)."""

KNOWN: dict[str, None] = {}
"""Ids that matched :data:`STREAM_ID` (a hot path may test ``sid in KNOWN`` first)."""


def is_valid(stream_id: str) -> bool:
    """``stream_id`` matches :data:`STREAM_ID` (the whole string: no trailing newline)."""
    if stream_id in KNOWN:
        return True
    if STREAM_ID_RE.fullmatch(stream_id) is None:
        return False
    if len(KNOWN) >= KNOWN_MAX:
        KNOWN.clear()
    KNOWN[stream_id] = None
    return True


def reason(stream_id: str) -> str:
    """Why ``stream_id`` is refused, naming the field, for an error message."""
    shown = stream_id if len(stream_id) <= 40 else stream_id[:40] + "..."
    return (
        f"stream_id: expected 1-{MAX_LENGTH} letters, digits or ._:- starting with a letter "
        f"or digit, got {shown!r}"
    )
