"""The registered SORT-family trackers: ``hybrid`` (= ``default``), ``bytetrack``, ``ocsort``.

All three run the same vectorised engine (:mod:`tracker.engine`); they differ
only in the defaults of their settings models (:mod:`tracker.settings`):

=========== ===== ====== ======= ========= ========= ========= ===== ========
name        low   HMIoU  robust  OCM       OCR       OCR dir.  ORU   report
            stage        Kalman  (dir. 1)  recovery  weight          >= score
=========== ===== ====== ======= ========= ========= ========= ===== ========
hybrid      yes   yes    2 sigma 0         grown     0.2       no    0.4
bytetrack   yes   no     no      0         no        0         no    0
ocsort      no    no     no      0.2       yes       0         yes   0
=========== ===== ====== ======= ========= ========= ========= ===== ========

``bytetrack`` and ``ocsort`` follow their papers (on this time-aware engine);
``hybrid`` is the combination that scored best on the evaluation (see
``tracker/README.md``) and is what ``default`` builds.
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
