"""A file source recorded next to a real ingest, and clips whose boxes do not flicker.

The sample clip is read by a real ingest (``--realtime --fps 5``, a real worker
process, results to a private redis-server) and by a real recorder: the
recorder records the file once at its frame rate and stops by itself. A clip
of that recording renders; between two results each track's box is held (the
boxes of 5 fps results are on every frame of the 25 fps clip, not one in five),
and is forgotten once stale.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np
import pytest

from framerelay.results import DetectionOut
from ingest.recording.clip import render_clip
from ingest.recording.draw import box_pixels
from ingest.recording.hold import BoxHold, default_hold_s
from ingest.recording.index import SegmentIndex
from ingest.recording.sidecar import read_lines
from tests.conftest import CLIP, ROOT, TIMEOUT_FACTOR, service_env
from tests.support.results_hub import kill_all
from tests.support.servers import RedisServer, free_port

pytestmark = pytest.mark.xdist_group("clip-hold")
"""One xdist group: the file recording (a module fixture) is made once for its two tests."""
STREAM = "stream-1"
FILE_FRAMES = 179
FILE_S = 7.16


def _det(tid: int, x: float = 10.0) -> DetectionOut:
    return DetectionOut(box=(x, 10.0, x + 20, 40.0), confidence=0.9, class_id=0,
                        class_name="person", tracker_id=tid)  # fmt: skip


def test_a_track_is_held_until_its_next_result_or_until_stale() -> None:
    hold = BoxHold(0.4)
    hold.result(0.0, [_det(1), _det(2), _det(-1)])
    assert [d.tracker_id for d in hold.at(0.0)] == [1, 2, -1]
    assert [d.tracker_id for d in hold.at(0.16)] == [1, 2, -1]  # between results: held
    hold.result(0.2, [_det(1, x=50)])  # track 2 missed once; the untracked box is replaced
    assert [(d.tracker_id, d.box[0]) for d in hold.at(0.2)] == [(1, 50.0), (2, 10.0)]
    assert [d.tracker_id for d in hold.at(0.44)] == [1]  # track 2 stale (0.44 s old)
    assert hold.at(0.7) == []  # no result since 0.2: everything stale
    hold.result(1.0, [_det(3)])
    hold.reset()  # a new epoch
    assert hold.at(1.04) == []
    only_own = BoxHold(0.0)
    only_own.result(2.0, [_det(4)])
    assert len(only_own.at(2.0)) == 1 and only_own.at(2.04) == []


def test_hold_is_twice_the_result_interval() -> None:
    assert default_hold_s([0.0, 0.2, 0.4, 0.6, 1.6]) == pytest.approx(0.4)
    assert default_hold_s([5.0]) == pytest.approx(0.4)  # cannot tell: 5 fps assumed
    assert default_hold_s([0.0, 60.0]) == 5.0  # capped
    with pytest.raises(ValueError, match="hold_s"):
        BoxHold(-1)


@dataclass
class FileRecording:
    directory: Path
    summary: dict[str, object]
    took_s: float


@pytest.fixture(scope="module")
def file_recording(
    local_worker: object, secret: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FileRecording]:
    tmp = tmp_path_factory.mktemp("file-recording")
    server = RedisServer(tmp / "redis", appendonly=False).start()
    env = service_env(FRAMERELAY_REDIS_URL=server.url, FRAMERELAY_TOKEN_SECRETS=secret,
                    FRAMERELAY_RECORD_MATCH_WINDOW_S="4")  # fmt: skip
    record = [sys.executable, "-m", "framerelay", "record", "--stream", STREAM, "--source",
              str(CLIP), "--out", str(tmp / "rec"), "--segment-s", "2"]  # fmt: skip
    ingest = [sys.executable, "-m", "framerelay", "ingest", "--worker-url",
              local_worker.url, "--worker-id", "test-worker", "--source", str(CLIP),  # type: ignore[attr-defined]
              "--fps", "5", "--realtime", "--api-port", str(free_port())]  # fmt: skip
    logs = [(tmp / n).open("wb") for n in ("record.log", "ingest.log")]
    procs = [subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=log)
             for cmd, log in zip((record, ingest), logs, strict=True)]  # fmt: skip
    started = time.monotonic()
    try:
        rc = procs[0].wait(90 * TIMEOUT_FACTOR)  # the recorder stops by itself
        took = time.monotonic() - started
        text = (tmp / "record.log").read_text(errors="replace")
        assert rc == 0, text[-3000:]
        summary = json.loads(text.strip().splitlines()[-1])
        yield FileRecording(tmp / "rec" / STREAM, summary, took)
    finally:
        kill_all(*procs)
        for log in logs:
            log.close()
        server.stop()


@pytest.mark.integration
def test_a_file_source_is_recorded_once_and_the_recorder_stops(
    file_recording: FileRecording,
) -> None:
    index = SegmentIndex.load(file_recording.directory, STREAM)
    segs = sorted(index.segments, key=lambda s: s.start_pts)
    print(f"\nrecorder stopped by itself after {file_recording.took_s:.1f} s: "
          f"{file_recording.summary}")  # fmt: skip
    assert file_recording.summary["source_ended"] is True
    assert {s.epoch for s in segs} == {0}  # recorded once: one epoch, no re-record
    assert sum(s.frames for s in segs) == FILE_FRAMES
    assert all(a.end_pts == b.start_pts for a, b in itertools.pairwise(segs))
    assert all(a.end_wall <= b.start_wall + 1e-6 for a, b in itertools.pairwise(segs))
    span = segs[-1].end_wall - segs[0].start_wall
    assert span == pytest.approx(FILE_S, abs=0.05)  # the file's own duration on the wall clock
    lines = [x for s in segs for x in read_lines(file_recording.directory / s.sidecar)]
    assert len(lines) >= 25 and all(x.exact for x in lines), len(lines)


def _decoded(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])]


@pytest.mark.integration
def test_a_clip_of_the_file_recording_holds_boxes_between_results(
    file_recording: FileRecording, tmp_path: Path
) -> None:
    index = SegmentIndex.load(file_recording.directory, STREAM)
    start = min(s.start_wall for s in index.segments)
    end = max(s.end_wall for s in index.segments)
    out = tmp_path / "clip.mp4"
    done = subprocess.run([sys.executable, "-m", "framerelay", "clip", "--stream", STREAM,
                           "--dir", str(file_recording.directory.parent), "--start", str(start),
                           "--end", str(end), "--out", str(out)], cwd=ROOT, env=service_env(),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert len(_decoded(out)) == FILE_FRAMES
    held = render_clip(file_recording.directory, start, end, tmp_path / "held.mp4")
    own = render_clip(file_recording.directory, start, end, tmp_path / "own.mp4", hold_s=0)
    assert held.hold_s == pytest.approx(0.4, abs=0.05)  # results every 0.2 s (5 fps)
    with_boxes = [bool(d) for d in held.drawn]
    first, last = with_boxes.index(True), len(with_boxes) - with_boxes[::-1].index(True)
    covered = sum(with_boxes[first:last]) / (last - first)
    flicker = sum(bool(d) for d in own.drawn) / len(own.drawn)
    print(f"\nframes with boxes: {covered:.0%} held, {flicker:.0%} on their own frames only")
    assert covered >= 0.95 and flicker <= 0.3
    _boxes_are_drawn_on_held_frames(file_recording, held.drawn, own.drawn, tmp_path / "held.mp4")


def _boxes_are_drawn_on_held_frames(
    rec: FileRecording,
    held: tuple[tuple[DetectionOut, ...], ...],
    own: tuple[tuple[DetectionOut, ...], ...],
    clip: Path,
) -> None:
    """Frames without a result of their own carry the previous result's tracked boxes, and
    the pixels show them."""
    index = SegmentIndex.load(rec.directory, STREAM)
    original = [f for s in sorted(index.segments, key=lambda s: s.start_pts)
                for f in _decoded(rec.directory / s.name)]  # fmt: skip
    drawn = _decoded(clip)
    checked = 0
    previous: dict[int, DetectionOut] = {}
    for i, (h, o) in enumerate(zip(held, own, strict=True)):
        if o:  # a result's own frame: remember its tracks
            previous = {d.tracker_id: d for d in o if d.tracker_id >= 0}
            continue
        if not previous or i + 1 >= len(held) or own[i + 1]:
            continue  # check frames in the middle between two results
        ids = {d.tracker_id: d for d in h if d.tracker_id >= 0}
        assert set(previous) <= set(ids), (i, sorted(previous), sorted(ids))
        diff = np.abs(drawn[i].astype(np.int32) - original[i].astype(np.int32)).sum(axis=2) > 90
        for det in previous.values():
            x1, y1, x2, y2 = box_pixels(det, diff.shape)
            edges = diff[y1 : y1 + 2, x1 : x2 + 1].mean() + diff[y1 : y2 + 1, x1 : x1 + 2].mean()
            assert edges / 2 > 0.6, (i, det.box)  # the held box is on the frame
        checked += 1
    assert checked >= 20, checked
