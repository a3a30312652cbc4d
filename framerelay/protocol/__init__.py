"""The tunnel's conversation, sans-I/O: one protocol object per connection and side.

:mod:`framerelay.wire` is the codec (one message <-> bytes); this package holds
the rules of the conversation on top of it, in the style of ``websockets``:
an explicit state, ``receive_data(bytes) -> events`` and ``send_*() -> bytes``.
The asyncio code around it (the ingest's tunnel client, the worker's tunnel
connection, the orchestrator's canary) only moves bytes and acts on events.

* :mod:`~framerelay.protocol.negotiation`: the version (a WebSocket
  subprotocol per major version) and HELLO's features.
* :mod:`~framerelay.protocol.ingest_side`: :class:`IngestProtocol`.
* :mod:`~framerelay.protocol.worker_side`: :class:`WorkerProtocol`.
* :mod:`~framerelay.protocol.events`: what they report.
"""

from __future__ import annotations

from framerelay.protocol.events import (
    OPEN_REFUSALS,
    FrameFailed,
    FrameReceived,
    HelloReceived,
    IngestEvent,
    InvalidState,
    PeerError,
    ProtocolViolation,
    Refused,
    ResultReceived,
    SnapshotReceived,
    StreamClosed,
    StreamOpened,
    WorkerEvent,
    probe_failure,
)
from framerelay.protocol.ingest_side import IngestProtocol, IngestState, SessionSnapshot
from framerelay.protocol.negotiation import NoCommonVersion
from framerelay.protocol.worker_side import WorkerProtocol, WorkerState

__all__ = [
    "OPEN_REFUSALS",
    "FrameFailed",
    "FrameReceived",
    "HelloReceived",
    "IngestEvent",
    "IngestProtocol",
    "IngestState",
    "InvalidState",
    "NoCommonVersion",
    "PeerError",
    "ProtocolViolation",
    "Refused",
    "ResultReceived",
    "SessionSnapshot",
    "SnapshotReceived",
    "StreamClosed",
    "StreamOpened",
    "WorkerEvent",
    "WorkerProtocol",
    "WorkerState",
    "probe_failure",
]
