"""Recording pieces on their own: frame matching, sidecars, index, retention, crash repair."""

from __future__ import annotations

import json
import time
from fractions import Fraction
from pathlib import Path
from typing import cast

import av
import numpy as np
import pytest
from numpy.typing import NDArray

from framerelay.results import DetectionOut, ResultId, ResultRecord
from framerelay.schemas import SidecarLine
from ingest.recording.draw import draw_detections, label_area, label_of
from ingest.recording.index import SegmentIndex, SegmentInfo, probe_pts
from ingest.recording.matcher import FrameLog
from ingest.recording.segmenter import MOVFLAGS, FrameEvent
from ingest.recording.sidecar import SidecarStore, gap_file, read_lines

TB = Fraction(1, 90_000)
T0 = 1_800_000_000.0


def record(pts: int, captured_at: float, tb: tuple[int, int] = (1, 90_000)) -> ResultRecord:
    return ResultRecord(
        id=f"{int(captured_at * 1000)}-{pts % 1000}", stream_id="cam", epoch=0, seq=0, pts=pts,
        time_base=tb, pts_time=float(pts * Fraction(*tb)), captured_at=captured_at,
        received_at=captured_at + 0.05, latency_ms=50, worker_id="w", detections=[],
    )  # fmt: skip


def frames(log: FrameLog, epoch: int, first_pts: int, wall0: float, n: int) -> None:
    """``n`` frames at 25 fps from ``first_pts``, the first arriving at ``wall0``."""
    log.open_epoch(epoch, TB, 33)
    for k in range(n):
        pts = first_pts + k * 3600
        log.add(FrameEvent(epoch, pts, wall0 + k * 0.04 + 0.003 * (k % 3), f"s{epoch}.mp4", pts))


def test_exact_match_picks_the_epoch_recording_at_capture_time() -> None:
    log = FrameLog(window_s=2.0)
    frames(log, 0, 0, T0, 250)  # 10 s
    frames(log, 1, 0, T0 + 30, 250)  # the same PTS again after a reconnect (a loop)
    late = log.place(record(36_000, T0 + 30.41), now=T0 + 31)
    assert late is not None and (late.segment, late.seg_pts, late.exact) == ("s1.mp4", 36_000, True)
    early = log.place(record(36_000, T0 + 0.45), now=T0 + 31)
    assert early is not None and early.segment == "s0.mp4"


def test_time_bases_and_the_mpegts_wrap() -> None:
    log = FrameLog(window_s=2.0)
    wrap = 1 << 33
    frames(log, 0, wrap - 36_000, T0, 50)  # recorder timeline just before the wrap
    # the ingest started after the wrap: its PTS (unwrapped from 0) are 2^33 lower
    after_wrap = record(36_000, T0 + 1.4)
    hit = log.place(after_wrap, now=T0 + 1.5)
    assert hit is not None and hit.exact and hit.seg_pts == wrap + 36_000
    log2 = FrameLog(window_s=2.0)
    frames(log2, 0, 0, T0, 50)
    at_12800 = record(512 * 20, T0 + 0.8, tb=(1, 12_800))  # 0.8 s = 72000 at 1/90000
    hit = log2.place(at_12800, now=T0 + 1)
    assert hit is not None and hit.exact and hit.seg_pts == 72_000


def test_waits_for_a_frame_then_decides_a_gap() -> None:
    log = FrameLog(window_s=2.0)
    frames(log, 0, 0, T0, 25)  # one second recorded
    future = record(10 * 90_000, T0 + 10)  # captured when nothing was recorded
    assert log.place(future, now=T0 + 11) is None  # the recorder may still get it
    gap = log.place(future, now=T0 + 12.5)
    assert gap is not None and gap.segment is None
    assert log.place(future, now=T0 + 11, final=True) == gap  # stopping: decide now


def test_unshared_timestamps_fall_back_to_the_nearest_frame_by_wall_clock() -> None:
    log = FrameLog(window_s=2.0)
    frames(log, 0, 1_234_567, T0, 100)  # this reader's PTS origin is its own
    hit = log.place(record(7200, T0 + 2.0), now=T0 + 5)
    assert hit is not None and not hit.exact
    assert hit.seg_pts == 1_234_567 + 50 * 3600  # the frame that arrived at T0 + 2.0
    log.exact_hits = 1  # once PTS are known to be shared, never guess
    gap = log.place(record(7200, T0 + 2.0), now=T0 + 5)
    assert gap is not None and gap.segment is None


def test_unshared_timestamps_lock_onto_one_offset_despite_clock_jitter() -> None:
    log = FrameLog(window_s=2.0)
    frames(log, 0, 500_000, T0, 500)  # 20 s; true offset: +500000 ticks
    jitter = [0.0, 0.03, -0.025, 0.01, 0.0, 0.028, -0.03, 0.0, 0.015, -0.01] * 4
    offsets = []
    for k, j in enumerate(jitter):  # results at 5 fps; capture times off by up to 30 ms
        frame = 10 + 5 * k
        hit = log.place(record(frame * 3600, T0 + frame * 0.04 + j), now=T0 + 60)
        assert hit is not None and hit.seg_pts is not None and not hit.exact
        offsets.append(hit.seg_pts - frame * 3600)
    assert set(offsets[10:]) == {500_000}  # locked: no frame slips once the votes are in


def test_old_frames_are_forgotten() -> None:
    log = FrameLog(window_s=2.0, horizon_s=5.0)
    frames(log, 0, 0, T0, 250)
    log.prune(T0 + 10)
    assert log.place(record(0, T0), now=T0 + 20) is not None
    assert log.place(record(0, T0), now=T0 + 20).segment is None  # type: ignore[union-attr]
    hit = log.place(record(240 * 3600, T0 + 9.6), now=T0 + 20)
    assert hit is not None and hit.exact


def line(rid: str, pts: int | None, segment: str | None = "s.mp4") -> SidecarLine:
    return SidecarLine(id=ResultId.parse(rid), segment=segment, pts=pts, time_base=(1, 90_000),
                       exact=True, result=record(pts or 0, T0))  # fmt: skip


def test_sidecar_ids_are_written_once_across_a_restart(tmp_path: Path) -> None:
    store = SidecarStore(tmp_path)
    assert store.write("s.jsonl", line("1-0", 0)) and store.write("s.jsonl", line("1-1", 3600))
    assert not store.write("s.jsonl", line("1-0", 0))
    store.flush()
    store.close()
    with (tmp_path / "s.jsonl").open("a") as f:
        f.write('{"v":1,"id":"1-2","seg')  # a crash in the middle of a line
    again = SidecarStore(tmp_path)
    assert again.recover() == 2
    assert not again.write("s.jsonl", line("1-1", 3600))  # redelivered: already there
    assert again.write("s.jsonl", line("1-2", 7200))  # the torn one comes again, whole
    again.close()
    assert [str(x.id) for x in read_lines(tmp_path / "s.jsonl")] == ["1-0", "1-1", "1-2"]


def test_readers_see_complete_lines_only(tmp_path: Path) -> None:
    """A live reader (a clip render, an app tailing the sidecar) may catch the recorder
    mid-line: its buffer flushes whenever it fills. A CI run read such a tail."""
    store = SidecarStore(tmp_path)
    store.write("s.jsonl", line("1-0", 0))
    store.write("s.jsonl", line("1-1", 3600))
    store.close()
    with (tmp_path / "s.jsonl").open("a") as f:
        f.write('{"v":1,"id":"1-2","segment":"s.mp4","pts":[1')
    assert [str(x.id) for x in read_lines(tmp_path / "s.jsonl")] == ["1-0", "1-1"]


def test_a_torn_line_does_not_stop_moving_lost_frames_to_gaps(tmp_path: Path) -> None:
    store = SidecarStore(tmp_path)
    for k in range(3):
        store.write("s.jsonl", line(f"1-{k}", k * 3600))
    store.close()
    with (tmp_path / "s.jsonl").open("a") as f:
        f.write('{"v":1,"id":"1-3","seg')  # the crash that cut the segment short
    again = SidecarStore(tmp_path)
    assert again.move_to_gaps("s.jsonl", {0}) == 2
    again.close()
    assert [str(x.id) for x in read_lines(tmp_path / "s.jsonl")] == ["1-0"]
    assert (tmp_path / "s.jsonl").read_bytes().endswith(b"\n")  # the torn tail is gone


def test_lines_of_lost_frames_move_to_a_gap_file(tmp_path: Path) -> None:
    store = SidecarStore(tmp_path)
    for k in range(4):
        store.write("s.jsonl", line(f"1-{k}", k * 3600))
    store.flush()
    assert store.move_to_gaps("s.jsonl", {0, 3600}) == 2
    store.close()
    assert [x.pts for x in read_lines(tmp_path / "s.jsonl")] == [0, 3600]
    moved = read_lines(tmp_path / gap_file(T0))
    assert [(str(x.id), x.segment, x.pts) for x in moved] == [
        ("1-2", None, None),
        ("1-3", None, None),
    ]


def _fragmented_mp4(path: Path, n: int = 50) -> None:
    with av.open(str(path), "w", format="mp4", options={"movflags": MOVFLAGS}) as out:
        stream = out.add_stream("mpeg4", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.codec_context.gop_size = 10
        for i in range(n):
            img = np.full((48, 64, 3), (i * 5) % 255, dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


def test_a_segment_cut_short_by_a_crash_is_kept_up_to_its_last_fragment(tmp_path: Path) -> None:
    index = SegmentIndex.load(tmp_path, "cam")
    info = SegmentInfo("a.mp4", 0, 1000, 1000, (1, 25), T0, T0)
    index.upsert(info)  # listed as "recording" when opened
    _fragmented_mp4(tmp_path / "a.mp4")
    data = (tmp_path / "a.mp4").read_bytes()
    (tmp_path / "a.mp4").write_bytes(data[: int(len(data) * 0.6)])  # the crash
    (tmp_path / "b.mp4").write_bytes(b"")  # a segment that never got a fragment
    index.upsert(SegmentInfo("b.mp4", 0, 2000, 2000, (1, 25), T0 + 2, T0 + 2))
    settled = {seg.name: pts for seg, pts in SegmentIndex.load(tmp_path, "cam").recover()}
    again = SegmentIndex.load(tmp_path, "cam")
    (seg,) = again.segments
    assert seg.state == "partial" and 10 <= seg.frames < 50
    assert settled["a.mp4"] == probe_pts(tmp_path / "a.mp4") and settled["b.mp4"] == []
    pts = settled["a.mp4"]
    assert seg.end_pts == 1000 + pts[-1] + (pts[-1] - pts[-2])  # last frame + its duration
    assert not (tmp_path / "b.mp4").exists()


def test_retention_by_age_and_by_size(tmp_path: Path) -> None:
    index = SegmentIndex.load(tmp_path, "cam")
    now = time.time()
    for k in range(5):
        name = f"s{k}.mp4"
        (tmp_path / name).write_bytes(b"x" * 100)
        (tmp_path / f"s{k}.jsonl").write_text("")
        index.upsert(SegmentInfo(name, 0, k, k + 1, (1, 1), now - 500 + k * 100,
                                 now - 400 + k * 100, bytes=100, state="complete"))  # fmt: skip
    removed = index.apply_retention(retention_s=250, max_bytes=0, now=now)
    assert [s.name for s in removed] == ["s0.mp4", "s1.mp4"]  # ended 400 and 300 s ago
    removed = index.apply_retention(retention_s=10_000, max_bytes=150, now=now)
    assert [s.name for s in removed] == ["s2.mp4", "s3.mp4"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.json", "s4.jsonl", "s4.mp4"]
    assert json.loads((tmp_path / "index.json").read_text())["segments"][0]["name"] == "s4.mp4"


@pytest.mark.parametrize("track", [3, -1])
def test_drawing_stays_inside_the_box_and_its_label(track: int) -> None:
    img = np.zeros((120, 160, 3), dtype=np.uint8)
    det = DetectionOut(box=(40.2, 50.0, 100.0, 110.0), confidence=0.876, class_id=0,
                       class_name="person", tracker_id=track)  # fmt: skip
    draw_detections(img, [det])
    drawn = cast("NDArray[np.bool_]", img.any(axis=2))  # an axis given: an array
    assert drawn[50, 40:101].all() and drawn[50:111, 40].all() and drawn[110, 40:101].all()
    assert not drawn[60:100, 45:95].any()  # the inside is left alone
    x1, y1, x2, y2 = label_area(label_of(det), 40, 50, img.shape)
    expected = np.zeros_like(drawn)
    expected[50:111, 40:101] = True
    expected[y1:y2, x1:x2] = True
    assert not drawn[~expected].any()
    assert label_of(det) == ("#3 person 0.88" if track >= 0 else "person 0.88")
