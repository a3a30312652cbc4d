"""A stream's URL is checked when the definition is made: a scheme outside the allowlist
(FFmpeg's ``proto:`` form without ``//`` included: issue 28), a URL with no host, or a
control character is a 422 that names the problem, not a stream that retries forever
(found by the console's add form; issue 15)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ingest.settings import StreamConfig


@pytest.mark.parametrize(
    "url",
    [
        "rtsp://cam.local:554/stream",
        "RTSP://cam/x",
        "rtsps://u:p@cam/x",
        "rtmp://cam/live/x",
        "http://h/a.m3u8",
        "https://[::1]:8443/x.mjpg",
        "udp://0.0.0.0:5000",
        "rtp://239.0.0.1:5004",
        "file:///videos/a.mp4",
        "/videos/a b.mp4",
        "./clips/a:b.mp4",
        "clip.mp4",
        "clips/a:b.mp4",
    ],
)
def test_usable_urls_are_accepted(url: str) -> None:
    assert StreamConfig(id="a", url=url).url == url


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("gopher://host/x", "scheme 'gopher' is not allowed"),
        ("gopher:127.0.0.1:6379/9/x/ANYLINE", "scheme 'gopher' is not allowed"),
        ("tcp://127.0.0.1:9", "scheme 'tcp' is not allowed"),
        ("unix:/run/redis.sock", "scheme 'unix' is not allowed"),
        ("pipe:0", "scheme 'pipe' is not allowed"),
        ("concat:/a.ts|/etc/passwd", "scheme 'concat' is not allowed"),
        ("ftp://host/clip.mp4", "scheme 'ftp' is not allowed"),
        ("srt://0.0.0.0:9000?mode=listener", "PyAV's FFmpeg has no SRT"),
        ("http:127.0.0.1:6379/x", "write http://host/..."),
        ("secret:pw@cam/x", "an unknown scheme"),
        ("http://", "no host after http://"),
        ("rtsp://admin:secret@/x", "no host after rtsp://"),
        ("rtsp://cam:99999/x", "check the host and the port"),
        ("rtsp://cam/x\nINFO forged log line", "control character"),
        ("javascript://alert(1)", "unknown scheme"),
        ("file:", "file path is empty"),
    ],
)
def test_unusable_urls_are_refused_with_the_reason_and_never_echoed(url: str, needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        StreamConfig(id="a", url=url)
    (error,) = info.value.errors()
    assert needle in error["msg"] and error["loc"] == ("url",)
    assert "secret" not in error["msg"] and "forged" not in error["msg"]
