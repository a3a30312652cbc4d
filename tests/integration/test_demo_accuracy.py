"""Acceptance: the demo on TUD-Stadtmitte, every frame, through the real CLI.

* results contain a ``person`` on >= 90 % of the frames whose ground truth has
  a person;
* every result's (epoch, pts) equals a decoded source frame's;
* under capacity nothing is lost: frames sent == results received.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import av
import pytest

from tests.conftest import CLIP, ROOT, STADTMITTE, TIMEOUT_FACTOR

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, object]], str]:
    out = tmp_path_factory.mktemp("demo") / "results.jsonl"
    TEMP.append(tmp_path_factory.mktemp("tmpdir"))  # the demo's TMPDIR
    proc = subprocess.run(
        [sys.executable, "-m", "framerelay", "demo", "--source", str(CLIP), "--fps", "0",
         "--out", str(out), "--quiet"],
        capture_output=True, text=True, timeout=300 * TIMEOUT_FACTOR, cwd=ROOT, check=False,
        env={**os.environ, "TMPDIR": str(TEMP[0])},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return rows, proc.stdout


TEMP: list[Path] = []
"""The demo run's TMPDIR (set by the fixture)."""


def test_a_clean_demo_leaves_no_worker_log_behind(
    demo_run: tuple[list[dict[str, object]], str],
) -> None:
    assert TEMP and not list(TEMP[0].glob("framerelay-worker-*.log"))


def gt_person_frames() -> set[int]:
    frames = set()
    for line in (STADTMITTE / "gt" / "gt.txt").read_text().splitlines():
        parts = line.split(",")
        if float(parts[6]) != 0:  # conf 0 rows are ignored regions
            frames.add(int(parts[0]))
    return frames


def decoded_pts() -> list[int]:
    pts: list[int] = []
    with av.open(str(CLIP)) as c:
        for f in c.decode(video=0):
            assert f.pts is not None
            pts.append(f.pts)
    return pts


def test_person_found_on_90_percent_of_gt_frames(
    demo_run: tuple[list[dict[str, object]], str],
) -> None:
    rows, _ = demo_run
    pts_to_frame = {p: i + 1 for i, p in enumerate(decoded_pts())}
    with_person = {
        pts_to_frame[r["pts"]]  # type: ignore[index]
        for r in rows
        if any(d["class_name"] == "person" for d in r["detections"])  # type: ignore[attr-defined]
    }
    gt = gt_person_frames()
    recall = len(with_person & gt) / len(gt)
    print(f"frames with a person: {len(with_person & gt)}/{len(gt)} = {recall:.3f}")
    assert recall >= 0.90


def test_every_result_matches_a_decoded_frame(
    demo_run: tuple[list[dict[str, object]], str],
) -> None:
    rows, _ = demo_run
    source = decoded_pts()
    assert len(rows) == len(source) == 179
    assert sorted((r["epoch"], r["pts"]) for r in rows) == [(0, p) for p in source]
    tb = rows[0]["time_base"]
    assert tb == [1, 12800]
    for r in rows:
        assert r["pts_time"] == pytest.approx(r["pts"] / 12800)  # type: ignore[operator]


def test_tracks_have_ids_and_stream_fields(demo_run: tuple[list[dict[str, object]], str]) -> None:
    rows, _ = demo_run
    ids: dict[int, int] = defaultdict(int)
    for r in rows:
        assert r["stream_id"] == "demo-1"
        assert r["worker_id"] == "demo-worker"
        for d in r["detections"]:  # type: ignore[attr-defined]
            if d["tracker_id"] > 0:
                ids[d["tracker_id"]] += 1
    long_tracks = [t for t, n in ids.items() if n >= 50]
    assert len(long_tracks) >= 5  # the people walking through the scene keep their ids


def test_under_capacity_sent_equals_received(demo_run: tuple[list[dict[str, object]], str]) -> None:
    _, table = demo_run
    row = next(line for line in table.splitlines() if line.strip().startswith("demo-1"))
    cells = row.split()
    decoded, sampled, sent, results, drops = (int(c) for c in cells[2:7])
    assert decoded == sampled == sent == results == 179
    assert drops == 0


def test_demo_rejects_missing_source() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "framerelay", "demo", "--source", "/nonexistent.mp4"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr
