"""The registered SORT-family trackers: ``hybrid`` (= ``default``), ``bytetrack``, ``ocsort``.

All three run the same vectorised engine (:mod:`tracker.engine`); they differ
in which association stages their settings switch on:

=========== ============ ================= ============= =================
name        low stage    direction (OCM)   recovery OCR  re-update (ORU)
=========== ============ ================= ============= =================
hybrid      yes          0.2               yes           yes
bytetrack   yes          0                 no            no
ocsort      no           0.2               yes           yes
=========== ============ ================= ============= =================
"""

from __future__ import annotations

from typing import ClassVar

from tracker.base import register_tracker
from tracker.engine import SortFamilyTracker
from tracker.settings import ByteTrackSettings, HybridSettings, OCSortSettings, SortSettings


@register_tracker("hybrid")
class HybridTracker(SortFamilyTracker):
    """ByteTrack's two-stage association with OC-SORT's observation-centric steps."""

    name: str = "hybrid"
    settings_model: ClassVar[type[SortSettings]] = HybridSettings


@register_tracker("bytetrack")
class ByteTrackTracker(SortFamilyTracker):
    """ByteTrack: high-confidence, then low-confidence association."""

    name: str = "bytetrack"
    settings_model: ClassVar[type[SortSettings]] = ByteTrackSettings


@register_tracker("ocsort")
class OCSortTracker(SortFamilyTracker):
    """OC-SORT: momentum, observation-centric recovery and re-update."""

    name: str = "ocsort"
    settings_model: ClassVar[type[SortSettings]] = OCSortSettings


DEFAULT_TRACKER = HybridTracker
"""What ``create_tracker("default")`` builds (its snapshots name ``hybrid``)."""
register_tracker("default")(DEFAULT_TRACKER)
