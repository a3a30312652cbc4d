"""End to end: camera -> ingest -> worker -> Redis -> recording worker (acceptance 3, 4).

A live HTTP MPEG-TS camera (the sample clip looped in real time) is read by a
real ingest (with a real worker process) that publishes results to a private
redis-server, and by a real recording worker. The recorder is killed with
SIGKILL mid-run and restarted. Then: every result id in the durable stream is
in exactly one sidecar; segments play with continuous PTS; every sidecar line
sits on a frame of its segment (the very frame the result was computed on);
and a rendered clip has the boxes drawn exactly on the frames with results.
"""

from __future__ import annotations

import collections
import itertools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import cast

import av
import numpy as np
import pytest
import redis

from framerelay.schemas import SidecarLine
from ingest.recording.clip import render_clip
from ingest.recording.draw import box_pixels, label_area, label_of
from ingest.recording.index import SegmentIndex
from ingest.recording.sidecar import GAP_DIR, read_lines
from tests.conftest import CLIP, ROOT, TIMEOUT_FACTOR, service_env
from tests.support.results_hub import kill_all
from tests.support.servers import RedisServer, free_port
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("recording")]
"""One xdist group: the recording (a module fixture) is made once for the three tests."""
STREAM = "stream-1"
KEY = f"framerelay:results:{STREAM}"


@dataclass
class Recording:
    directory: Path
    ids: list[str]  # every id in the durable stream, in order
    second_run: dict[str, int]


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, *args], env=env, cwd=ROOT, stdout=out, stderr=out)


def _lines(directory: Path) -> list[SidecarLine]:
    paths = [*directory.glob("*.jsonl"), *(directory / GAP_DIR).glob("*.jsonl")]
    return [line for p in paths for line in read_lines(p)]


def _summary(log: Path) -> dict[str, int]:
    last = log.read_text(errors="replace").strip().splitlines()[-1]
    return dict(json.loads(last))


@pytest.fixture(scope="module")
def recording(
    local_worker: object, secret: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Recording]:
    tmp = tmp_path_factory.mktemp("recording")
    server = RedisServer(tmp / "redis", appendonly=False).start()
    camera = subprocess.Popen([sys.executable, str(ROOT / "tests/results/camera.py"),
                               "--clip", str(CLIP)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert camera.stdout is not None
    url = f"http://127.0.0.1:{json.loads(camera.stdout.readline())['port']}/live.ts"
    env = service_env(FRAMERELAY_REDIS_URL=server.url, FRAMERELAY_TOKEN_SECRETS=secret,
                    FRAMERELAY_RECORD_MATCH_WINDOW_S="5")  # fmt: skip
    record = ["-m", "framerelay", "record", "--stream", STREAM, "--source", url,
              "--out", str(tmp / "rec"), "--segment-s", "2"]  # fmt: skip
    ingest_args = ["-m", "framerelay", "ingest", "--worker-url", local_worker.url,  # type: ignore[attr-defined]
                   "--worker-id", "test-worker", "--source", url, "--fps", "10", "--realtime",
                   "--api-port", str(free_port())]  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    r = redis.Redis.from_url(server.url, decode_responses=True)
    directory = tmp / "rec" / STREAM
    try:
        recorder = _spawn(record, env, tmp / "record-1.log")
        procs.append(recorder)
        procs.append(_spawn(ingest_args, env, tmp / "ingest.log"))
        wait_until(lambda: len(_lines(directory)) >= 25, 60, "25 results recorded")
        recorder.send_signal(signal.SIGKILL)  # mid-run, mid-segment
        recorder.wait(10)
        time.sleep(2)
        again = _spawn(record, env, tmp / "record-2.log")
        procs.append(again)
        wait_until(lambda: r.xlen(KEY) >= 100, 60, "100 durable results")
        procs[1].send_signal(signal.SIGTERM)  # the ingest stops: no more results
        procs[1].wait(30)

        def settled() -> bool:
            group = r.xinfo_groups(KEY)[0]
            return int(group["pending"]) == 0 and int(group.get("lag") or 0) == 0

        wait_until(settled, 30, "the recorder has taken every result")
        again.send_signal(signal.SIGTERM)
        assert again.wait(30) == 0, (tmp / "record-2.log").read_text()[-3000:]
        entries = cast("list[tuple[str, dict[str, str]]]", r.xrange(KEY))  # decode_responses: str
        ids = [i for i, _ in entries]
        yield Recording(directory, ids, _summary(tmp / "record-2.log"))
    finally:
        kill_all(*procs, camera)
        camera.stdout.close()
        r.close()
        server.stop()


def test_every_durable_result_is_in_exactly_one_sidecar(recording: Recording) -> None:
    counts = collections.Counter(str(line.id) for line in _lines(recording.directory))
    assert len(recording.ids) >= 100
    assert set(counts) == set(recording.ids), "results lost or invented"
    assert max(counts.values()) == 1, [i for i, n in counts.items() if n > 1][:5]
    index = SegmentIndex.load(recording.directory, STREAM)
    assert len({s.epoch for s in index.segments}) >= 2  # the restart began a new epoch
    gaps = [x for x in _lines(recording.directory) if x.segment is None]
    print(f"\n{len(recording.ids)} durable results, each in one sidecar; {len(gaps)} in gap "
          f"files (captured while the recorder was down)\nrecorder after the restart: "
          f"{recording.second_run}")  # fmt: skip
    assert gaps, "results captured while the recorder was down belong in a gap file"


def _segment_pts(path: Path) -> list[int]:
    with av.open(str(path)) as c:
        return [f.pts for f in c.decode(c.streams.video[0]) if f.pts is not None]


def test_segments_play_with_continuous_pts_and_sidecars_sit_on_their_frames(
    recording: Recording,
) -> None:
    index = SegmentIndex.load(recording.directory, STREAM)
    by_epoch: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)
    checked = 0
    for seg in index.segments:
        pts = _segment_pts(recording.directory / seg.name)
        assert pts and pts[0] == 0 and len(pts) == seg.frames, seg.name
        steps = set(np.diff(pts).tolist())
        assert steps == {3600}, (seg.name, steps)  # 25 fps in 1/90000, no gap, no repeat
        assert seg.end_pts == seg.start_pts + pts[-1] + 3600
        by_epoch[seg.epoch].append((seg.start_pts, seg.end_pts))
        frames = set(pts)
        for line in read_lines(recording.directory / seg.sidecar):
            assert line.segment == seg.name and line.pts in frames
            assert line.exact  # shared camera timestamps: matched by PTS, never guessed
            source = line.result.pts * Fraction(*line.result.time_base)
            assert source == (seg.start_pts + (line.pts or 0)) * seg.tb
            checked += 1
    for spans in by_epoch.values():
        spans.sort()
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    assert checked >= 50


def _decoded(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])]


def test_a_rendered_clip_has_the_boxes_on_the_right_frames(
    recording: Recording, tmp_path: Path
) -> None:
    index = SegmentIndex.load(recording.directory, STREAM)
    with_results = [s for s in index.segments if read_lines(recording.directory / s.sidecar)]
    seg = with_results[len(with_results) // 2]
    out = tmp_path / "clip.mp4"
    # hold_s=0: each box on its own frame only (boxes held between results: test_clip_hold)
    summary = render_clip(recording.directory, seg.start_wall, seg.end_wall - 0.001, out, hold_s=0)
    lines = {x.pts: x for x in read_lines(recording.directory / seg.sidecar)}
    original, drawn = _decoded(recording.directory / seg.name), _decoded(out)
    assert len(drawn) == len(original) == summary.frames
    pts = _segment_pts(recording.directory / seg.name)
    sampled = 0
    for i, frame_pts in enumerate(pts):
        diff = np.abs(drawn[i].astype(np.int32) - original[i].astype(np.int32)).sum(axis=2) > 90
        line = lines.get(frame_pts)
        if line is None or not line.result.detections:
            assert diff.mean() < 0.002, f"frame {i} has no result but something was drawn"
            continue
        expected = np.zeros_like(diff)
        for det in line.result.detections:
            x1, y1, x2, y2 = box_pixels(det, diff.shape)
            top = diff[y1 : y1 + 2, x1 : x2 + 1]
            left = diff[y1 : y2 + 1, x1 : x1 + 2]
            assert (top.mean() + left.mean()) / 2 > 0.6, (i, det.box)  # the box is there
            expected[max(0, y1 - 3) : y2 + 4, max(0, x1 - 3) : x2 + 4] = True
            lx1, ly1, lx2, ly2 = label_area(label_of(det), x1, y1, diff.shape)
            expected[max(0, ly1 - 3) : ly2 + 3, max(0, lx1 - 3) : lx2 + 3] = True  # codec blur
        assert diff[~expected].mean() < 0.002, f"frame {i}: drawn outside the sidecar's boxes"
        sampled += 1
    assert sampled >= 5
    assert TIMEOUT_FACTOR > 0
