"""Every frame counter of an ingest stream is exported once, in exactly one metric part:
a counter added to ``ingest.stream.COUNTERS`` without a place in ``ingest.metrics``
fails here (before it silently went missing from /metrics, or double-counted)."""

from __future__ import annotations

import collections

from ingest.metrics import (
    DROP_REASONS,
    PACKET_DROPS,
    SINGLE_COUNTERS,
    SOURCE_FAILURES,
    STAGES,
)
from ingest.stream import COUNTERS


def test_every_stream_counter_has_exactly_one_place() -> None:
    placed = [*STAGES, "results", *DROP_REASONS, *PACKET_DROPS, *SOURCE_FAILURES,
              *(key for _, key, _ in SINGLE_COUNTERS)]  # fmt: skip
    twice = [name for name, n in collections.Counter(placed).items() if n > 1]
    assert twice == []
    assert set(placed) == set(COUNTERS)
