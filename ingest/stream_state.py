"""A stream's vocabulary: its states, the frame it hands to the sender, its counters.

Kept apart from :mod:`ingest.stream` (the decode thread and state machine) so the
modules that only read a stream's state and counters (metrics, history, the API)
need not know how it decodes; :mod:`ingest.stream` re-exports every name.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from framerelay.wire import Timing
from ingest.prepare import Prepared


class StreamState(enum.StrEnum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RECONNECTING = "RECONNECTING"
    STALLED = "STALLED"
    AUTH_FAILED = "AUTH_FAILED"
    STOPPED = "STOPPED"
    FAILED = "FAILED"


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A prepared frame waiting for a credit, with its timing (what FRAME carries)."""

    timing: Timing
    prepared: Prepared


COUNTERS = (
    "decoded", "no_pts", "sampled_out", "no_credit", "prepared", "sent", "results", "replaced",
    "decode_error", "encode_error", "disconnected", "timeout", "worker_error",
    "corrupt", "behind", "open_error", "stall", "source_lost", "reconnects",
    "auth_failed", "size_refused", "corrupt_timestamps", "out_of_range",
)  # fmt: skip
