"""The recorder on a local file: once by default, pass after pass with ``loop``, and a
missing file is one line, not a traceback."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import av
import pytest

from ingest.recording.index import SegmentIndex
from ingest.recording.segmenter import Event, Segmenter, SegmentEvent
from ingest.recording.settings import RecorderSettings
from tests.conftest import CLIP, ROOT, service_env


@pytest.fixture(scope="module")
def short_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("short") / "short.mp4"
    subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-i", str(CLIP), "-t", "1.2",
                    "-c", "copy", str(out)], check=True, timeout=60)  # fmt: skip
    return out


def _frames(path: Path) -> int:
    with av.open(str(path)) as c:
        return sum(1 for p in c.demux(c.streams.video[0]) if p.pts is not None and p.size)


def test_loop_records_the_file_pass_after_pass_in_real_time(
    short_clip: Path, tmp_path: Path
) -> None:
    settings = RecorderSettings(stream_id="cam", source=str(short_clip), out_dir=tmp_path,
                                segment_s=10, loop=True,
                                redis_url="redis://127.0.0.1:1/0")  # fmt: skip
    index = SegmentIndex.load(tmp_path / "cam", "cam")

    def sink(ev: Event) -> None:
        if isinstance(ev, SegmentEvent):
            index.upsert(ev.info)

    segmenter = Segmenter(settings, tmp_path / "cam", sink, index.take_epoch)
    stop = threading.Event()
    thread = threading.Thread(target=segmenter.run, args=(stop,))
    thread.start()
    time.sleep(3.2)  # two whole passes of 1.2 s and part of a third
    stop.set()
    thread.join(5)
    assert not thread.is_alive() and not segmenter.ended  # looping: it ends only when stopped
    done = sorted((s for s in index.segments if s.state == "complete"), key=lambda s: s.epoch)
    assert len({s.epoch for s in done}) >= 2
    per_pass = _frames(short_clip)
    first, second = done[0], done[1]
    assert first.frames == second.frames == per_pass
    assert abs(second.start_wall - first.end_wall) < 0.25  # one after the other, in real time
    assert first.end_wall - first.start_wall == pytest.approx(per_pass / 25, abs=0.05)


def test_record_refuses_a_missing_file_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "framerelay", "record", "--stream", "cam", "--source",
         str(tmp_path / "nope.mp4"), "--out", str(tmp_path / "rec")],
        cwd=ROOT, env=service_env(FRAMERELAY_REDIS_URL="redis://127.0.0.1:6379/0"),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"framerelay: error: --source {tmp_path / 'nope.mp4'}: no such file"
    ]
