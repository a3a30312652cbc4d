"""Every kind of source the ingest reads, each from a real server on loopback:
RTSP over UDP, RTSP with credentials (never logged), HTTP progressive, HLS, RTMP."""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any
from urllib.parse import quote

import pytest

from ingest.settings import StreamConfig
from ingest.stream import IngestStream, Outgoing, StreamState
from tests.support.fixtures import media  # noqa: F401 - fixture
from tests.support.harness import standalone
from tests.support.media import Media
from tests.support.servers import RtspServer, http_server, rtmp_server
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.integration
PASSWORD = "s3cr3t:/@pw"  # needs quoting in a URL


async def _collect(
    cfg: StreamConfig, frames: int, timeout_s: float = 20, *, to_the_end: bool = False
) -> dict[str, Any]:
    """The figures once ``frames`` came (or the stream finished); ``to_the_end``: once it
    finished too (a source whose last frame is the ``frames``-th still has its end to read)."""
    started = time.monotonic()
    async with standalone(cfg) as (stream, got):
        await wait_until_async(lambda: len(got) >= 1, timeout_s, f"{cfg.id}: a frame", every_s=0.02)
        first = time.monotonic()
        await wait_until_async(
            lambda: len(got) >= frames or stream.finished, timeout_s, f"{cfg.id}: frames"
        )
        if to_the_end:
            await wait_until_async(lambda: stream.finished, timeout_s, f"{cfg.id}: its end")
        return _figures(stream, list(got), first - started)


def _figures(stream: IngestStream, got: list[Outgoing], first_s: float) -> dict[str, Any]:
    info = stream.source_info
    assert info is not None
    return {
        "first_frame_s": first_s,
        "frames": len(got),
        "format": info.format,
        "wrap_bits": info.wrap_bits,
        "codec": info.codec,
        "state": stream.state,
        "epochs": {o.timing.epoch for o in got},
        "monotonic": all(a.timing.pts < b.timing.pts for a, b in itertools.pairwise(got)),
        "live": stream.spec.live,
        "describe": stream.describe(),
    }


async def test_rtsp_over_udp(media: Media) -> None:  # noqa: F811
    with RtspServer(media.h264_clip()) as cam:
        cam.start()
        fig = await _collect(StreamConfig(id="udp", url=cam.url, rtsp_transport="udp"), 10)
    print(f"\nRTSP/UDP: first frame after {fig['first_frame_s']:.2f} s")
    assert fig["frames"] >= 10 and fig["monotonic"] and fig["live"] and fig["codec"] == "h264"


async def test_http_progressive_file_and_hls(media: Media) -> None:  # noqa: F811
    # built before the server serves their folder; the MP4 has its index first (a
    # simple static server cannot answer the range requests a trailing index needs)
    clip = media.h264_clip()
    media.hls()
    with http_server(media.root) as base:
        mp4 = await _collect(StreamConfig(id="http", url=f"{base}/{clip.name}", fps=0), 250)
        hls_cfg = StreamConfig(id="hls", url=f"{base}/hls/index.m3u8", fps=0)
        hls = await _collect(hls_cfg, 250, to_the_end=True)
    assert mp4["frames"] >= 250 and mp4["state"] is StreamState.RUNNING and not mp4["live"]
    assert hls["frames"] == 250 and hls["state"] is StreamState.STOPPED
    assert hls["format"] == "hls" and hls["wrap_bits"] == 33  # MPEG-TS segments: 33-bit PTS
    assert mp4["monotonic"] and hls["monotonic"] and hls["epochs"] == {0}


async def test_rtmp(media: Media) -> None:  # noqa: F811
    with rtmp_server(media.short("mp4")) as url:
        fig = await _collect(StreamConfig(id="rtmp", url=url, fps=5), 5)
    print(f"\nRTMP: first frame after {fig['first_frame_s']:.2f} s")
    assert fig["live"] and fig["format"] == "flv" and fig["wrap_bits"] == 32
    assert fig["frames"] >= 5 and fig["monotonic"]
    assert fig["first_frame_s"] < 4.0  # FLV probing alone took ~5 s before analyzeduration


@pytest.mark.parametrize("how", ["url", "fields"])
async def test_rtsp_credentials_work_and_never_show(
    media: Media,  # noqa: F811
    how: str,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    with RtspServer(media.h264_clip(), user="cam", password=PASSWORD) as cam:
        cam.start()
        rest = cam.url.removeprefix("rtsp://")

        def config(sid: str, password: str) -> StreamConfig:
            if how == "url":
                url = f"rtsp://cam:{quote(password, safe='')}@{rest}"
                return StreamConfig(id=sid, url=url, auth_retry_s=0.3)
            return StreamConfig(
                id=sid, url=cam.url, username="cam", password=password, auth_retry_s=0.3
            )

        good = await _collect(config("good", PASSWORD), 3)

        cfg = config("bad", PASSWORD + "-wrong")
        async with standalone(cfg) as (stream, _):
            await wait_until_async(lambda: stream.counters["auth_failed"] >= 2, 10, "refusals")
            bad = stream.describe() | {"history": list(stream.history)}
    assert good["frames"] >= 3 and good["describe"]["source"].startswith("rtsp://")
    assert bad["state"] == "AUTH_FAILED" and "Unauthorized" in str(bad["error"])
    assert bad["open_error"] == 0  # an authentication failure, retried every auth_retry_s
    out, err = capfd.readouterr()
    seen = caplog.text + out + err + repr(good["describe"]) + repr(bad)
    for secret in (PASSWORD, quote(PASSWORD, safe=""), "s3cr3t"):
        assert secret not in seen
    assert "Unauthorized" in caplog.text  # the reason is logged, the password is not
