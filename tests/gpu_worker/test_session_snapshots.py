"""When a session sends its tracker snapshot (issue 17, several ingests).

A replica that takes a stream over resumes the session from the newest snapshot it
finds; a track born after that snapshot is unknown to the resumed tracker, which would
hand its id out again to someone else. So besides the interval, a frame that reports a
track id newer than the last snapshot is followed by a snapshot.
"""

from __future__ import annotations

import numpy as np

from framerelay import wire
from framerelay.detections import Detections
from gpu_worker.sessions import new_session, resumed_session
from tracker import create_tracker

FPS = 5.0


def _frame(k: int) -> wire.Frame:
    return wire.Frame(stream_id="cam-1", seq=k, epoch=0, pts=k, time_base=(1, int(FPS)),
                      captured_at=1.0e9 + k / FPS, src_w=640, src_h=480, scale=1.0)  # fmt: skip


def _people(k: int, count: int) -> Detections:
    """``count`` well separated people walking right, 4 px a frame."""
    x = np.arange(count, dtype=np.float32) * 150.0 + 4.0 * k
    boxes = np.stack([x, np.full(count, 50.0), x + 60.0, np.full(count, 230.0)], axis=1)
    return Detections(boxes.astype(np.float32), np.full(count, 0.9, np.float32),
                      np.zeros(count, np.int32))  # fmt: skip


def _run(interval_s: float, people: list[int]) -> list[tuple[int, bool]]:
    """(highest id reported, snapshot sent) per frame."""
    session = new_session("cam-1", "default", 0.25, interval_s)
    out = []
    for k, count in enumerate(people):
        tracked = session.track(_frame(k), _people(k, count))
        newest = int(tracked.tracker_id.max()) if len(tracked) else -1
        out.append((newest, session.snapshot_due(tracked)))
    return out


def test_a_new_track_id_is_followed_by_a_snapshot_between_intervals() -> None:
    frames = [2] * 10 + [3] * 10  # a third person walks in at frame 10
    steps = _run(60.0, frames)
    snapped = [k for k, (_, due) in enumerate(steps) if due]
    ids = [newest for newest, _ in steps]
    born = [k for k in range(1, len(ids)) if ids[k] > max(ids[:k])]
    assert snapped[0] == 0  # the first frame, as before
    assert born and set(born) <= set(snapped), (born, snapped, ids)
    assert len(snapped) == 1 + len(born)  # nothing else within a minute's interval


def test_without_new_ids_only_the_interval_counts() -> None:
    steps = _run(1.0, [2] * 16)  # 3.2 s at 5 fps; both ids reported from the first frame
    assert [k for k, (_, due) in enumerate(steps) if due] == [0, 5, 10, 15], steps


def test_zero_interval_still_means_never() -> None:
    assert not any(due for _, due in _run(0.0, [2] * 5 + [3] * 5))


def test_a_resumed_session_snapshots_its_first_frame() -> None:
    blob = create_tracker("default").snapshot()
    session = resumed_session("cam-1", blob, wire.SessionClock(), 0.25, 60.0)
    tracked = session.track(_frame(0), _people(0, 2))
    assert session.snapshot_due(tracked)
    assert not session.snapshot_due(tracked)


def test_an_interval_of_one_frame_period_snapshots_every_frame() -> None:
    """0.2 s at 5 fps: 0.4 + 0.2 is above 15/25 in floating point, which skipped a frame."""
    steps = _run(1.0 / FPS, [2] * 12)
    assert all(due for _, due in steps), steps
