"""A stream's own tracker time settings, as the APIs take them (ingest and orchestrator).

Each one left out keeps the worker's tracker default. The ingest sends those set
in the stream's OPEN (:class:`framerelay.wire.TrackerTimes`); the worker applies
them to the stream's tracker (``tracker.settings.TrackerSettings`` has the same
bounds: ``tests/tracker/test_tracker_times_bounds.py`` keeps them equal).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from framerelay import wire


class TrackerTimesConfig(BaseModel):
    """Seconds; every value finite and bounded (NaN, Infinity, out of range: a 422)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    max_lost_s: float | None = Field(
        None, ge=0.0, le=3600.0,
        description="A confirmed track unmatched for longer is dropped (default 1.2).",
    )  # fmt: skip
    max_gap_s: float | None = Field(
        None, ge=0.0, le=60.0,
        description="An outage (the stream re-homed to another worker) up to this long is "
        "bridged: its tracks are predicted over it instead of aged (default 10; 0: never).",
    )  # fmt: skip
    tentative_max_gap_s: float | None = Field(
        None, ge=0.0, le=60.0,
        description="A tentative track unmatched for longer is dropped (default 0.2).",
    )  # fmt: skip
    direction_window_s: float | None = Field(
        None, ge=0.0, le=10.0,
        description="Baseline of a track's motion direction (default 0.12).",
    )  # fmt: skip

    def to_wire(self) -> wire.TrackerTimes | None:
        """The OPEN's ``tracker_settings``; None when nothing is set."""
        values = self.model_dump(exclude_none=True)
        return wire.TrackerTimes(**values) if values else None
