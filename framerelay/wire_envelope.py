"""The tunnel's message envelope: the prefix before every header, the size limits,
the message types and the close codes (re-exported by :mod:`framerelay.wire`)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

PREFIX = struct.Struct(">BBI")
"""version u8, type u8, header length u32 big-endian."""


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


class CloseCode(IntEnum):
    """The WebSocket close codes of the tunnel."""

    PROTOCOL = 1002
    """A message broke the protocol (also: no common version at the handshake)."""
    UNSUPPORTED_DATA = 1003
    """A text message: the tunnel carries binary messages only."""
    POLICY = 1008
    """Too many bad frames: a misbehaving peer."""
    TOO_BIG = 1009
    INTERNAL = 1011
    """The worker's inference stalled or ended."""
    TRY_AGAIN_LATER = 1013
    """The peer does not read its results."""


class MsgType(IntEnum):
    HELLO = 1
    OPEN = 2
    CLOSE = 3
    FRAME = 4
    RESULT = 5
    ERROR = 6
    SNAPSHOT = 7
