"""Time through a real decode: PTS unwrap across 2^33, epochs, resolution change, no PTS."""

from __future__ import annotations

import itertools
import logging

import pytest

from ingest.settings import StreamConfig
from ingest.stream import StreamState
from tests.support.harness import run_to_end
from tests.support.media import WRAP, Media


@pytest.mark.parametrize("ffmpeg_unwraps", [True, False], ids=["ffmpeg-corrects", "raw-wrap"])
async def test_mpegts_crosses_2_33_with_continuous_time_and_one_epoch(
    media: Media, ffmpeg_unwraps: bool
) -> None:
    # FFmpeg corrects one wrap itself (correct_ts_overflow); with that off the raw
    # 33-bit counter wraps and our Timeline must unwrap it.
    options = {} if ffmpeg_unwraps else {"correct_ts_overflow": "0"}
    cfg = StreamConfig(id="wrap", url=str(media.ts_near_wrap(3.0)), fps=0, options=options)
    stream, got = await run_to_end(cfg)
    assert stream.state is StreamState.STOPPED and stream.error is None
    assert len(got) == stream.counters["decoded"] == 250
    assert {o.timing.epoch for o in got} == {0}
    assert got[0].timing.time_base == (1, 90_000)
    steps = [b.timing.pts - a.timing.pts for a, b in itertools.pairwise(got)]
    assert set(steps) == {3600}, "every 1/25 s step must be exactly 3600 ticks"
    first, last = got[0].timing.pts, got[-1].timing.pts
    crossed = first % WRAP > WRAP - 4 * 90_000 and (last - first) == 249 * 3600
    assert crossed


async def test_resolution_change_mid_stream_is_letterboxed_per_frame(media: Media) -> None:
    cfg = StreamConfig(id="res", url=str(media.resolution_change_ts()), fps=0)
    stream, got = await run_to_end(cfg)
    sizes = {(o.prepared.letterbox.src_w, o.prepared.letterbox.src_h) for o in got}
    assert sizes == {(320, 240), (640, 480)}
    assert stream.counters["decode_error"] == 0 and stream.counters["encode_error"] == 0
    for o in got:
        lb = o.prepared.letterbox
        assert (lb.new_w, lb.new_h) == (416, 312)  # both are 4:3


async def test_looping_file_starts_a_new_epoch_each_pass(media: Media) -> None:
    cfg = StreamConfig(id="loop", url=str(media.short("ts")), fps=5, loop=True, max_frames=600)
    stream, got = await run_to_end(cfg)
    assert stream.counters["decoded"] == 600
    assert next(o.timing.epoch for o in got) == 0 and {o.timing.epoch for o in got} == {0, 1, 2}
    for epoch in (0, 1, 2):
        pts = [o.timing.pts for o in got if o.timing.epoch == epoch]
        assert pts == sorted(pts)
    # sampling by PTS: 5 fps out of 25 in every epoch
    assert 115 <= len(got) <= 125


async def test_frames_without_pts_are_dropped_counted_and_explained(
    media: Media, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ingest.stream")
    cfg = StreamConfig(id="raw", url=str(media.short("h264")), fps=0)
    stream, got = await run_to_end(cfg)
    assert got == []
    assert stream.counters["no_pts"] == stream.counters["decoded"] == 250
    assert stream.state is StreamState.STOPPED
    assert "none has a timestamp" in caplog.text
