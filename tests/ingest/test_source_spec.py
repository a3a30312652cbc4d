"""How a stream definition becomes what FFmpeg opens, and what logs may show."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from urllib.parse import quote

import pytest
from pydantic import ValidationError

from framerelay.errors import SourceError
from ingest.settings import StreamConfig
from ingest.source import AVSource, Opened, SourceSpec, SourceUnavailable
from ingest.store import FileStore, MemoryStore, StoreError
from tests.support.media import Media


@pytest.mark.parametrize(
    ("url", "live", "network", "options"),
    [
        ("rtsp://cam/s", True, True, {"rtsp_transport": "tcp"}),
        ("rtsps://cam/s", True, True, {"rtsp_transport": "tcp"}),
        ("rtmp://cam/live", True, True, {"analyzeduration": "1000000"}),
        ("udp://0.0.0.0:5000", True, True, {}),
        ("https://cdn/x.m3u8", False, True, {}),
        ("http://cam/video.ts", False, True, {}),
        ("file:///clips/a.mp4", False, False, {}),
        ("/clips/a.mp4", False, False, {}),
    ],
)
def test_live_network_and_protocol_defaults_by_scheme(
    url: str, live: bool, network: bool, options: dict[str, str]
) -> None:
    spec = SourceSpec.from_config(StreamConfig(id="s", url=url))
    assert (spec.live, spec.network, spec.options) == (live, network, options)


def test_settings_override_the_defaults() -> None:
    cfg = StreamConfig(
        id="s", url="rtmp://cam/live", live=False, rtsp_transport="udp",
        options={"analyzeduration": "5000000", "user_agent": "framerelay"}, realtime=True,
    )  # fmt: skip
    spec = SourceSpec.from_config(cfg)
    assert spec.options == {"analyzeduration": "5000000", "user_agent": "framerelay"}
    assert not spec.live and spec.pace  # a non-live source with realtime is paced
    udp = SourceSpec.from_config(StreamConfig(id="s", url="rtsp://c/x", rtsp_transport="udp"))
    assert udp.options["rtsp_transport"] == "udp" and not udp.pace  # live: never paced


def test_credentials_are_quoted_into_the_url_and_scrubbed_everywhere() -> None:
    password = "p@ss:w/rd"
    cfg = StreamConfig(id="s", url="rtsp://cam:554/s", username="ad min", password=password)
    spec = SourceSpec.from_config(cfg)
    assert spec.url == f"rtsp://ad%20min:{quote(password, safe='')}@cam:554/s"
    assert spec.display == "rtsp://cam:554/s"
    assert password not in repr(spec) and "p%40ss" not in repr(spec)
    ffmpeg_says = f"Server returned 401 Unauthorized: '{spec.url}' (pw {password})"
    scrubbed = spec.scrub(ffmpeg_says)
    assert password not in scrubbed and quote(password, safe="") not in scrubbed
    assert "rtsp://***@cam:554/s" in scrubbed
    embedded = SourceSpec.from_config(StreamConfig(id="s", url="rtsp://u:pw%3A1@cam/s"))
    assert embedded.display == "rtsp://***@cam/s" and "pw" not in embedded.scrub(embedded.url)
    assert embedded.scrub("auth failed for pw:1 / pw%3A1") == "auth failed for *** / ***"


@pytest.mark.parametrize(
    "bad",
    [
        {"url": "rtsp://u:p@cam/s", "username": "u"},
        {"url": "rtsp://cam/s", "password": "p"},
        {"url": "rtsp://cam/s", "options": {"Bad-Key": "1"}},
        {"url": "rtsp://cam/s", "rtsp_transport": "sctp"},
        {"url": "rtsp://cam/s", "max_retries": -1},
        {"url": "rtsp://cam/s", "read_timeout_s": 0},
        {"url": "rtsp://cam/s", "surprise": 1},
    ],
)
def test_bad_definitions_are_refused_without_showing_values(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError) as info:
        StreamConfig.model_validate({"id": "s", **bad})
    assert "u:p@" not in str(info.value)


def test_username_needs_a_url_that_can_carry_it() -> None:
    with pytest.raises(SourceError, match="need an rtsp"):
        SourceSpec.from_config(StreamConfig(id="s", url="/a.mp4", username="u"))


def test_a_file_that_cannot_be_opened_fails_with_one_reason_whatever_the_cause(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Missing, not video, a folder: the same words (no file-existence oracle); the log,
    which only the operator reads, has FFmpeg's own reason."""
    (tmp_path / "text.mp4").write_text("root:x:0:0:root:/root:/bin/bash\n")
    reasons = set()
    for name in ("nope.mp4", "text.mp4", "."):
        spec = SourceSpec.from_config(StreamConfig(id="s", url=str(tmp_path / name)))
        with pytest.raises(SourceUnavailable) as info:
            AVSource(spec).session(threading.Event(), lambda _: None, lambda _: True)
        reasons.add(str(info.value).replace(spec.display, "<path>"))
    assert reasons == {
        "cannot open <path>: not a readable video file (missing, unreadable or holding no "
        "video: check the path, its permissions and the file)"
    }
    assert "No such file" in caplog.text and "Invalid data" in caplog.text


def test_opened_describes_the_stream(media: Media) -> None:
    spec = SourceSpec.from_config(StreamConfig(id="s", url=str(media.short("ts"))))
    seen: list[Opened] = []
    AVSource(spec).session(threading.Event(), seen.append, lambda _: False)
    (opened,) = seen
    assert (opened.codec, opened.format, opened.wrap_bits, opened.fps) == ("h264", "mpegts", 33, 25)


async def test_file_store_round_trip_and_refuses_foreign_files(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "a" / "streams.json")
    assert await store.load() == []
    cfg = StreamConfig(id="s", url="rtsp://cam/s", username="u", password="pw")
    await store.put(cfg)
    await store.put(StreamConfig(id="t", url="/x.mp4"))
    await store.delete("t")
    await store.delete("never-there")
    (loaded,) = await store.load()
    assert loaded.password is not None and loaded.password.get_secret_value() == "pw"
    assert loaded == cfg
    (tmp_path / "foreign.json").write_text(json.dumps({"streams": []}))
    with pytest.raises(StoreError, match="not a framerelay stream store"):
        await FileStore(tmp_path / "foreign.json").load()
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(StoreError, match="cannot read"):
        await FileStore(tmp_path / "broken.json").load()
    memory = MemoryStore()
    await memory.put(cfg)
    assert await memory.load() == [cfg]


def test_repr_and_answers_hide_url_credentials_and_sensitive_options() -> None:
    cfg = StreamConfig(
        id="s", url="https://u:pw1@h/x", options={"headers": "X-Key: k3y", "user_agent": "fr"}
    )
    assert "pw1" not in repr(cfg) and "k3y" not in repr(cfg)
    public = json.dumps(cfg.public())
    assert "pw1" not in public and "k3y" not in public and '"user_agent": "fr"' in public
    assert "k3y" in json.dumps(cfg.stored())
