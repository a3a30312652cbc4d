"""A stream's URL is checked when the definition is made: a scheme FFmpeg would not
open, a URL with no host, or a control character is a 422 that names the problem, not a
stream that retries forever (found by the console's add form; issue 15)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ingest.settings import StreamConfig


@pytest.mark.parametrize(
    "url",
    ["rtsp://cam.local:554/stream", "RTSP://cam/x", "rtsps://u:p@cam/x", "http://h/a.m3u8",
     "srt://0.0.0.0:9000?mode=listener", "udp://0.0.0.0:5000", "file:///videos/a.mp4",
     "/videos/a b.mp4", "clip.mp4", "ftp://host/clip.mp4"],
)  # fmt: skip
def test_usable_urls_are_accepted(url: str) -> None:
    assert StreamConfig(id="a", url=url).url == url


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("gopher://host/x", "unknown scheme 'gopher'"),
        ("http://", "no host after http://"),
        ("rtsp://admin:secret@/x", "no host after rtsp://"),
        ("rtsp://cam/x\nINFO forged log line", "control character"),
        ("javascript://alert(1)", "unknown scheme"),
    ],
)
def test_unusable_urls_are_refused_with_the_reason_and_never_echoed(url: str, needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        StreamConfig(id="a", url=url)
    (error,) = info.value.errors()
    assert needle in error["msg"] and error["loc"] == ("url",)
    assert "secret" not in error["msg"] and "forged" not in error["msg"]
