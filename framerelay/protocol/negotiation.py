"""Which tunnel protocol version two peers speak, agreed at the WebSocket handshake.

Each major version of the tunnel protocol is a WebSocket subprotocol,
``framerelay.v<N>``. The ingest offers every version it supports, newest first
(:func:`offer`); the worker picks the newest one it supports among those
(:func:`select`) and every message on that connection is written in that
version (:mod:`framerelay.wire`, the version byte). A peer that offers no
subprotocol at all is a v1 peer from before negotiation existed: it is
served v1 while v1 is supported. A peer that offers only versions this side
does not speak is refused with a :class:`NoCommonVersion` whose message is
the close reason (the worker closes with :attr:`framerelay.wire.CloseCode.PROTOCOL`).

Within a version, HELLO's ``features`` say what the worker supports beyond
the version's core; the ingest uses :func:`has_feature` and ignores names it
does not know. A v1 worker sends no features: it supports :data:`V1_FEATURES`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from websockets.typing import Subprotocol

from framerelay import wire
from framerelay.errors import ProtocolError

PREFIX = "framerelay.v"
MAX_REASON_BYTES = 123
"""The most a WebSocket close reason may hold (RFC 6455)."""
RESUME = "resume"
"""The worker resumes a session from a snapshot sent in OPEN (track ids continue)."""
SNAPSHOTS = "snapshots"
"""The worker sends SNAPSHOT messages of its sessions."""
MODELS = "models"
"""The worker serves several models: an OPEN may name one (``Open.model``), a RESULT
names the model that found it, HELLO lists them (``Hello.models``)."""
FEATURES: tuple[str, ...] = (RESUME, SNAPSHOTS, MODELS)
"""What this code's worker supports (sent in HELLO)."""
V1_FEATURES = frozenset({RESUME, SNAPSHOTS})
"""What a v1 worker supports (its HELLO names none)."""


class NoCommonVersion(ProtocolError):
    """The peer speaks no tunnel protocol version this side speaks."""

    def __init__(self, message: str) -> None:
        super().__init__(message, close_code=wire.CloseCode.PROTOCOL)


def subprotocol(version: int) -> Subprotocol:
    """The WebSocket subprotocol of a protocol version: ``framerelay.v<N>``."""
    return Subprotocol(f"{PREFIX}{version}")


def offer(versions: Sequence[int] = wire.SUPPORTED_VERSIONS) -> list[Subprotocol]:
    """Subprotocols to offer (the ingest's ``subprotocols=``), newest first."""
    return [subprotocol(v) for v in versions]


def version_of(name: str | None) -> int | None:
    """``framerelay.v2`` -> 2; None for a name that is not a framerelay version."""
    if name is None or not name.startswith(PREFIX):
        return None
    digits = name[len(PREFIX) :]
    if not digits.isdigit() or len(digits) > 4 or digits.startswith("0"):
        return None
    return int(digits)


def select(offered: Iterable[str], supported: Sequence[int] = wire.SUPPORTED_VERSIONS) -> int:
    """The worker's choice: the newest supported version among ``offered``; 1 when
    nothing was offered (a peer from before negotiation) and 1 is supported.
    Raises :class:`NoCommonVersion` with the close reason otherwise."""
    names = list(offered)
    versions = {version_of(n) for n in names} - {None}
    if not names and 1 in supported:
        return 1
    for version in supported:
        if version in versions:
            return version
    raise NoCommonVersion(
        close_reason(
            f"no common tunnel version: this worker speaks {', '.join(offer(supported))}; "
            f"the peer offered {', '.join(names) or 'none (v1)'}"
        )
    )


def accepted(name: str | None, supported: Sequence[int] = wire.SUPPORTED_VERSIONS) -> int:
    """The ingest's check of the worker's choice (``ws.subprotocol``): its version.
    None (the worker chose nothing) is a v1 worker from before negotiation.
    Raises :class:`NoCommonVersion` for a version not supported here."""
    version = 1 if name is None else version_of(name)
    if version is None or version not in supported:
        raise NoCommonVersion(
            close_reason(
                f"no common tunnel version: this ingest speaks {', '.join(offer(supported))}; "
                f"the worker chose {name or 'none (v1)'}"
            )
        )
    return version


def has_feature(hello: wire.Hello, version: int, feature: str) -> bool:
    """Whether the worker that sent ``hello`` (in ``version``) supports ``feature``."""
    if version == 1:
        return feature in V1_FEATURES
    return feature in hello.features


def close_reason(text: str) -> str:
    """``text`` on one line, cut to fit a close frame (123 bytes of UTF-8)."""
    line = " ".join(text.split())
    return line.encode()[:MAX_REASON_BYTES].decode(errors="ignore")
