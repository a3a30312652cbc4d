"""Usable source sizes, the wire's letterbox limits, and memory after large frames.

A 1x1 or 7x7 source is FAILED before any frame reaches the tunnel (it once made
the sender raise on ``scale=416`` and killed the ingest), and so is one larger
than 4K; neither is retried, live or not. A frame the wire cannot carry is
dropped and counted, never raised. Decoding 8K frames gives its memory back.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import av
import pytest
from pydantic import ValidationError

from framerelay import wire
from framerelay.geometry import Letterbox
from framerelay.wire import MAX_SCALE, MAX_SIDE
from ingest.prepare import Preparer, Unsendable, check_sendable
from ingest.settings import StreamConfig
from ingest.source import SourceSpec
from ingest.stream import IngestStream, Outgoing, StreamState
from tests.support.harness import standalone
from tests.support.media import Media, ffmpeg
from tests.support.servers import http_server
from tests.support.waiting import wait_until_async

RSS_SLACK_MB = 20.0
UHD_8K = (7680, 4320)


@pytest.fixture(scope="module")
def sized(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Tiny sources (H.264 4:4:4 allows odd sizes) and a 5-frame 8K file, made with ffmpeg."""
    root = tmp_path_factory.mktemp("sized")
    files: dict[str, Path] = {}
    for w, h, ext in ((1, 1, "mp4"), (7, 7, "mp4"), (7, 7, "ts"), (32, 32, "mp4")):
        out = root / f"{w}x{h}.{ext}"
        ffmpeg("-f", "lavfi", "-i", f"color=c=gray:size={max(w, 16)}x{max(h, 16)}:rate=25",
               "-t", "2", "-vf", f"scale={w}:{h}", "-c:v", "libx264", "-pix_fmt", "yuv444p",
               str(out))  # fmt: skip
        files[f"{w}x{h}.{ext}"] = out
    big = root / "8k.mp4"
    ffmpeg("-f", "lavfi", "-i", f"color=c=gray:size={UHD_8K[0]}x{UHD_8K[1]}:rate=5",
           "-frames:v", "5", "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p",
           str(big))  # fmt: skip
    files["8k"] = big
    yield files


async def _run(config: StreamConfig, timeout_s: float = 30) -> tuple[IngestStream, list[Outgoing]]:
    async with standalone(config) as (stream, got):
        await wait_until_async(lambda: not stream.alive, timeout_s, f"{config.id} to end")
    return stream, got


# -- sizes --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "problem"),
    [
        ((1, 1), "smaller than min_width x min_height (32x32)"),
        ((7, 7), "smaller"),
        ((31, 480), "smaller"),
        ((32, 32), None),
        ((3840, 2160), None),
        ((2160, 3840), None),  # portrait 4K: either orientation
        ((3841, 2160), "larger than max_width x max_height (3840x2160, either orientation)"),
        (UHD_8K, "larger"),
    ],
)
def test_size_limits_name_the_size_and_the_setting(
    size: tuple[int, int], problem: str | None
) -> None:
    spec = SourceSpec.from_config(StreamConfig(id="s", url="x.mp4"))
    found = spec.size_problem(*size)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found and f"{size[0]}x{size[1]}" in found


def test_min_above_max_is_refused() -> None:
    with pytest.raises(ValidationError, match="must not exceed"):
        StreamConfig(id="s", url="x.mp4", min_width=800, max_width=640)


@pytest.mark.parametrize("name", ["1x1.mp4", "7x7.mp4"])
async def test_tiny_file_is_failed_before_any_frame_with_the_reason(
    sized: dict[str, Path], name: str
) -> None:
    stream, got = await _run(StreamConfig(id="tiny", url=str(sized[name]), fps=0))
    print(f"\n{name}: {stream.state.value}: {stream.error}")
    assert stream.state is StreamState.FAILED and got == []
    assert stream.error is not None
    assert "source size" in stream.error and "min_width x min_height (32x32)" in stream.error
    assert stream.counters["size_refused"] == 1 and stream.counters["decoded"] == 0


async def test_tiny_network_source_is_not_retried(sized: dict[str, Path]) -> None:
    with http_server(sized["7x7.ts"].parent) as base:
        cfg = StreamConfig(id="tiny-http", url=f"{base}/7x7.ts", fps=0, reconnect_initial_s=0.05)
        stream, got = await _run(cfg)
    assert stream.state is StreamState.FAILED and got == []
    assert stream.counters["size_refused"] == 1 and stream.counters["reconnects"] == 0
    assert stream.error is not None and "7x7" in stream.error


async def test_a_source_growing_past_max_mid_stream_is_failed(media: Media) -> None:
    # 3 s at 320x240, then 640x480: over a 400x300 maximum at the change.
    cfg = StreamConfig(
        id="grow", url=str(media.resolution_change_ts()), fps=0, max_width=400, max_height=300
    )
    stream, got = await _run(cfg)
    assert stream.state is StreamState.FAILED
    assert stream.error is not None and "640x480" in stream.error and "max_width" in stream.error
    assert got and {(o.prepared.letterbox.src_w, o.prepared.letterbox.src_h) for o in got} == {
        (320, 240)
    }
    assert stream.counters["size_refused"] == 1


# -- the wire's limits, second line -----------------------------------------------


def _frame(scale: float, side: int = 100) -> wire.Frame:
    return wire.build(
        wire.Frame,
        stream_id="s", epoch=0, seq=0, pts=0, time_base=(1, 90_000), captured_at=0.0,
        src_w=side, src_h=side, scale=scale,
    )  # fmt: skip


def test_prepare_limits_are_the_wires() -> None:
    _frame(MAX_SCALE, MAX_SIDE)
    for bad in ({"scale": MAX_SCALE * 1.0001}, {"scale": 1.0, "side": MAX_SIDE + 1}):
        with pytest.raises(wire.InvalidMessage):
            _frame(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("src", "dst", "ok"),
    [
        ((1, 1), (416, 416), False),  # scale 416
        ((6, 6), (416, 416), False),  # 69.3
        ((7, 7), (416, 416), True),  # 59.4
        ((7, 7), (1280, 1280), False),
        ((4, 4000), (416, 416), True),  # min(104, 0.104)
        ((MAX_SIDE + 2, 100), (416, 416), False),
    ],
)
def test_check_sendable(src: tuple[int, int], dst: tuple[int, int], ok: bool) -> None:
    lb = Letterbox.fit(*src, *dst)
    if ok:
        check_sendable(lb)
        _frame(lb.scale)
    else:
        with pytest.raises(Unsendable, match="the wire carries"):
            check_sendable(lb)


def test_preparer_refuses_a_frame_the_wire_cannot_carry() -> None:
    frame = av.VideoFrame(2, 2, "yuv420p")
    with pytest.raises(Unsendable, match="scale 208"):
        Preparer(416, 416).prepare(frame)


async def test_frames_past_the_wire_limits_are_dropped_and_counted(sized: dict[str, Path]) -> None:
    # With the size check opened wide, the preparer still keeps 1x1 frames off the wire.
    cfg = StreamConfig(id="one", url=str(sized["1x1.mp4"]), fps=0, min_width=1, min_height=1)
    stream, got = await _run(cfg)
    print(f"\n1x1 allowed: {stream.state.value}, counters {stream.counters}")
    assert stream.state is StreamState.STOPPED and stream.error is None and got == []
    assert stream.counters["decoded"] == 50 == stream.counters["out_of_range"]
    assert stream.counters["encode_error"] == 0


# -- memory ---------------------------------------------------------------------


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def test_8k_is_refused_by_default_and_its_memory_released_when_allowed(
    sized: dict[str, Path],
) -> None:
    await _run(
        StreamConfig(id="warm", url=str(sized["32x32.mp4"]), fps=0)
    )  # imports, pools, arenas
    gc.collect()
    before = _rss_mb()
    refused, got = await _run(StreamConfig(id="8k-default", url=str(sized["8k"]), fps=0))
    gc.collect()
    after_refused = _rss_mb()
    assert refused.state is StreamState.FAILED and got == []
    assert refused.error is not None and "7680x4320" in refused.error
    assert "max_width x max_height (3840x2160" in refused.error
    assert refused.counters["size_refused"] == 1 and refused.counters["decoded"] == 0
    figures = [f"before {before:.1f} MB", f"after refused 8K {after_refused:.1f} MB"]
    for n in range(2):
        cfg = StreamConfig(
            id=f"8k-{n}", url=str(sized["8k"]), fps=0, max_width=UHD_8K[0], max_height=UHD_8K[1]
        )
        allowed, got = await _run(cfg)
        assert allowed.state is StreamState.STOPPED and allowed.counters["decoded"] == 5
        assert len(got) == 5
        del allowed, got
        gc.collect()
        figures.append(f"after decoding 8K #{n + 1} {_rss_mb():.1f} MB")
    after = _rss_mb()
    print("\nRSS: " + ", ".join(figures))
    assert after_refused - before < RSS_SLACK_MB
    assert after - before < RSS_SLACK_MB, figures
