"""``framerelay clip`` renders any recording, or fails with one line and leaves no file.

Recordings are made by the real segmenter from the sample clip (a file source).
Every failure is run through the real CLI as a subprocess: exit 1 (the
recording or the disk) or 2 (the arguments), one line on stderr, no traceback,
and nothing at ``--out`` nor any partial file beside it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import av
import numpy as np
import pytest

from ingest.recording.clip import render_clip
from ingest.recording.index import SegmentIndex
from tests.conftest import CLIP, ROOT, service_env
from tests.support.clip_rig import record_file


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two passes of the sample file (two epochs overlapping on the wall clock)."""
    out = tmp_path_factory.mktemp("rec")
    record_file(out, CLIP, passes=2)
    return out


def _span(rec: Path) -> tuple[float, float]:
    index = SegmentIndex.load(rec / "cam-1", "cam-1")
    return min(s.start_wall for s in index.segments), max(s.end_wall for s in index.segments)


def _clip(
    rec: Path, out: Path, *extra: str, start: str = "", end: str = ""
) -> subprocess.CompletedProcess[str]:
    if not (start and end):
        first, last = _span(rec)
        start, end = start or str(first), end or str(last)
    args = ["--stream", "cam-1", "--dir", str(rec), "--out", str(out), "--start", start,
            "--end", end, *extra]  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "framerelay", "clip", *args],
        cwd=ROOT,
        env=service_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _pts(path: Path) -> list[int]:
    with av.open(str(path)) as c:
        return [f.pts for f in c.decode(c.streams.video[0]) if f.pts is not None]


def test_overlapping_recordings_of_a_file_render_each_instant_once(
    recorded: Path, tmp_path: Path
) -> None:
    out = tmp_path / "clip.mp4"
    done = _clip(recorded, out)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    pts = _pts(out)
    index = SegmentIndex.load(recorded / "cam-1", "cam-1")
    assert {s.epoch for s in index.segments} == {0, 1}
    first_pass = sum(s.frames for s in index.segments if s.epoch == 0)
    assert first_pass == 179  # every frame of the file, once per pass
    assert len(pts) >= first_pass and len(pts) < 2 * first_pass  # the overlap given once
    assert np.all(np.diff(pts) > 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.mp4"]


def _corrupt_index(rec: Path) -> None:
    (rec / "cam-1" / "index.json").write_text("{not json", encoding="utf-8")


def _segments_gone(rec: Path) -> None:
    for seg in (rec / "cam-1").glob("*.mp4"):
        seg.write_bytes(b"not an mp4")


def _bad_sidecar(rec: Path) -> None:
    seg = SegmentIndex.load(rec / "cam-1", "cam-1").segments[0]
    (rec / "cam-1" / seg.sidecar).write_text('{"id": 1}\n', encoding="utf-8")


def _nothing(rec: Path) -> None:
    del rec


CASES: list[tuple[str, Callable[[Path], None], list[str], dict[str, str], int, str]] = [
    (
        "no such stream",
        _nothing,
        ["--stream", "nope"],
        {"start": "1", "end": "2"},
        1,
        "no recording of stream 'nope'",
    ),
    ("nothing then", _nothing, [], {"start": "1000", "end": "1001"}, 1, "nothing was recorded"),
    ("bad time", _nothing, [], {"start": "yesterday"}, 2, "bad time 'yesterday'"),
    ("nan time", _nothing, [], {"end": "nan"}, 2, "bad time 'nan'"),
    ("end before start", _nothing, [], {"start": "2000", "end": "1000"}, 2, "end must be after"),
    ("bad hold", _nothing, ["--hold-s", "-1"], {}, 2, "--hold-s must be"),
    ("corrupt index", _corrupt_index, [], {"start": "1", "end": "2"}, 1, "cannot read"),
    ("damaged segments", _segments_gone, [], {}, 1, "hold no frame in that time range"),
    ("bad sidecar", _bad_sidecar, [], {}, 1, "cannot read the sidecar"),
]


@pytest.mark.parametrize(("setup", "extra", "times", "code", "message"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])  # fmt: skip
def test_a_failure_is_one_line_and_leaves_no_file(
    recorded: Path,
    tmp_path: Path,
    setup: Callable[[Path], None],
    extra: list[str],
    times: dict[str, str],
    code: int,
    message: str,
) -> None:
    rec = tmp_path / "rec"
    shutil.copytree(recorded, rec)
    setup(rec)
    clips = tmp_path / "clips"
    clips.mkdir()
    done = _clip(rec, clips / "c.mp4", *extra, **times)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    assert len(lines) == 1 and lines[0].startswith("framerelay: error: "), done.stderr
    assert message in lines[0]
    assert list(clips.iterdir()) == []  # no clip, no partial file


def test_a_failure_after_rendering_leaves_no_partial_file(recorded: Path, tmp_path: Path) -> None:
    out = tmp_path / "taken.mp4"
    out.mkdir()  # the rename at the end fails: the rendered temp file must go too
    done = _clip(recorded, out)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "cannot write" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.mp4"]
    assert list(out.iterdir()) == []


def test_an_unknown_clip_format_is_a_usage_error(recorded: Path, tmp_path: Path) -> None:
    done = _clip(recorded, tmp_path / "clip.avi2")
    assert done.returncode == 2 and "must end in .mp4" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_clip_summary_lists_the_boxes_of_every_frame(recorded: Path, tmp_path: Path) -> None:
    first, _ = _span(recorded)
    summary = render_clip(recorded / "cam-1", first, first + 2, tmp_path / "c.mp4")
    assert summary.frames == len(summary.drawn) == len(_pts(tmp_path / "c.mp4"))
    assert summary.boxes == 0 and summary.frames_with_results == 0  # no results recorded
    assert json.dumps(summary.hold_s)
