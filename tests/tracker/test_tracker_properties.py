"""Property tests: random detection streams never crash and never reuse an id."""

from __future__ import annotations

from typing import cast

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from framerelay.detections import Detections
from tracker import create_tracker, restore_tracker
from tracker.engine import SortFamilyTracker
from tracker.tracks import TENTATIVE

coord = st.floats(min_value=-50, max_value=700, allow_nan=False, width=32)
size = st.floats(min_value=0, max_value=300, allow_nan=False, width=32)
row = st.tuples(
    coord, coord, size, size, st.floats(0, 1, width=32), st.integers(min_value=0, max_value=2)
)
frame = st.tuples(
    st.sampled_from([0.0, 0.001, 0.04, 0.04, 0.04, 0.2, 0.9, 3.0]), st.lists(row, max_size=10)
)
tracker_settings = st.fixed_dictionaries(
    {},
    optional={
        "min_hits": st.integers(1, 4),
        "confirm_first_update": st.booleans(),
        "max_lost_s": st.sampled_from([0.0, 0.3, 1.0, 5.0]),
        "tentative_max_gap_s": st.sampled_from([0.0, 0.1, 1.0]),
        "class_aware": st.booleans(),
        "match_iou": st.sampled_from([0.0, 0.2, 0.9]),
        "direction_weight": st.sampled_from([0.0, 0.2, 1.5]),
    },
)


def _detections(rows: list[tuple[float, float, float, float, float, int]]) -> Detections:
    if not rows:
        return Detections.empty()
    a = np.array([r[:5] for r in rows], np.float32)
    xyxy = np.column_stack([a[:, 0], a[:, 1], a[:, 0] + a[:, 2], a[:, 1] + a[:, 3]])
    return Detections(xyxy, a[:, 4], np.array([r[5] for r in rows], np.int32))


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(["default", "bytetrack", "ocsort"]),
    options=tracker_settings,
    frames=st.lists(frame, max_size=40),
    cut=st.integers(min_value=0, max_value=40),
)
def test_random_streams(
    name: str,
    options: dict[str, object],
    frames: list[tuple[float, list[tuple[float, float, float, float, float, int]]]],
    cut: int,
) -> None:
    trk = cast(SortFamilyTracker, create_tracker(name, **options))  # default/bytetrack/ocsort
    issued: set[int] = set()
    highest = 0
    t = 0.0
    outputs = []
    stream = []
    for dt, rows in frames:
        t += dt
        d = _detections(rows)
        stream.append((t, d))
        out = trk.update(d, t)
        outputs.append(out.tracker_id)
        assert np.array_equal(out.xyxy, d.xyxy) and len(out) == len(d)
        ids = out.tracker_id[out.tracker_id != -1]
        assert (ids >= 1).all()
        assert len(set(ids.tolist())) == ids.size, "one id on two detections"
        fresh = set(ids.tolist()) - issued
        assert all(i > highest for i in fresh), "an id was handed out twice"
        issued |= fresh
        highest = max([highest, *fresh])
        live = trk.tracks.track_id[trk.tracks.status != TENTATIVE]
        assert len(set(live.tolist())) == live.size and (live >= 1).all()
    # a snapshot taken anywhere continues identically
    cut = min(cut, len(stream))
    again = create_tracker(name, **options)
    for ti, d in stream[:cut]:
        again.update(d, ti)
    again = restore_tracker(again.snapshot())
    for k, (ti, d) in enumerate(stream[cut:], start=cut):
        assert np.array_equal(again.update(d, ti).tracker_id, outputs[k])
