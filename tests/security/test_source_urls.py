"""Issue 28, hole 2: a stream's source reaches only what a camera source may be.

A real ingest API on 127.0.0.1 (the in-process rig), a ``streams:write`` token, and a
loopback TCP listener that counts every connection made to it. Each URL and option the
issue quotes (FFmpeg's ``proto:`` forms, ``gopher``/``tcp``/``unix``/``pipe``/``concat``,
``http:`` without ``//``, the signing key file, ``/etc/passwd``; ``method``, ``headers``
with CR/LF, ``post_data``, ``protocol_whitelist``...) is refused with a 422 and a
one-line reason naming the problem, no stream is created or stored, and the listener
records 0 connections. HLS playlists served over HTTP whose segment is ``file:``,
``concat:``, ``gopher://`` or ``tcp://`` open nothing but the playlist: the stream fails
with a clear reason, decodes no frame, and the listener records 0 connections. Positive
controls show the listener does count (an allowed ``http://`` source to it) and that
what is allowed still plays (a clip under a file root, an HLS playlist with an HTTP
segment).
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ingest.config_file import load_streams
from ingest.settings import IngestSettings
from ingest.source import AVSource, SourceSpec, SourceUnavailable
from tests.support.auth import ed_keys
from tests.support.fixtures import media  # noqa: F401 - fixture
from tests.support.ingest_api import Ingest, client, running_ingest
from tests.support.media import Media
from tests.support.servers import CountingListener, counting_listener, http_server
from tests.support.waiting import wait_until_async

WRITE = ("streams:read", "streams:write")


@pytest.fixture
def listener() -> Iterator[CountingListener]:
    with counting_listener() as found:
        yield found


def _stored(ingest: Ingest) -> list[str]:
    if not ingest.store_path.exists():
        return []
    return [s["id"] for s in json.loads(ingest.store_path.read_text())["streams"]]


async def _refused(ingest: Ingest, http: httpx.AsyncClient, body: dict[str, Any]) -> str:
    """POST and PUT ``body``: both 422, nothing created or stored; the one-line reason."""
    auth = ingest.auth(*WRITE)
    answers = [
        await http.post("/v1/streams", json=body, headers=auth),
        await http.put(f"/v1/streams/{body['id']}", json=body, headers=auth),
    ]
    assert [r.status_code for r in answers] == [422, 422], [r.text for r in answers]
    reasons = [_reason(r.json()) for r in answers]
    assert reasons[0] == reasons[1] and "\n" not in reasons[0], reasons
    assert body["id"] not in ingest.service.streams and body["id"] not in _stored(ingest)
    shown = (await http.get(f"/v1/streams/{body['id']}", headers=ingest.auth(*WRITE))).status_code
    assert shown == 404
    return reasons[0]


def _reason(answer: dict[str, Any]) -> str:
    detail = answer["detail"]
    if isinstance(detail, str):  # the source policy (ingest.source_policy)
        return detail
    (error,) = detail  # a definition's own validation: where and why
    return f"{'.'.join(str(p) for p in error['loc'][1:])}: {error['msg']}"


def _evil_urls(port: int, key_file: Path) -> list[tuple[str, str]]:
    return [
        (f"gopher:127.0.0.1:{port}/9/x/ANYLINE", "scheme 'gopher' is not allowed"),
        (f"gopher://127.0.0.1:{port}/_SET%20x%201", "scheme 'gopher' is not allowed"),
        (f"tcp:127.0.0.1:{port}", "scheme 'tcp' is not allowed"),
        (f"tcp://127.0.0.1:{port}", "scheme 'tcp' is not allowed"),
        ("unix:/run/redis/redis.sock", "scheme 'unix' is not allowed"),
        ("pipe:0", "scheme 'pipe' is not allowed"),
        (f"concat:http://127.0.0.1:{port}/a|/etc/passwd", "scheme 'concat' is not allowed"),
        (f"subfile,,start,0,end,0,,:http://127.0.0.1:{port}/x", "an unknown scheme"),
        (f"http:127.0.0.1:{port}/x", "write http://host/"),
        (f"rtsp:127.0.0.1:{port}/x", "write rtsp://host/"),
        (f"ftp://127.0.0.1:{port}/x", "scheme 'ftp' is not allowed"),
        ("/etc/passwd", "local files cannot be added over the API"),
        ("file:/etc/passwd", "local files cannot be added over the API"),
        (str(key_file), "local files cannot be added over the API"),
    ]


def _key_file(tmp_path: Path) -> Path:
    """The primary cloud's private key set, where FRAMERELAY_SIGNING_KEYS_FILE names it."""
    folder = tmp_path / "secrets"
    folder.mkdir(exist_ok=True)
    path = folder / "signing.jwks"
    path.write_text(ed_keys().to_json())
    path.chmod(0o600)
    return path


async def test_evil_source_urls_are_refused_and_reach_nothing(
    tmp_path: Path, listener: CountingListener
) -> None:
    key_file = _key_file(tmp_path)

    async with running_ingest(ed_keys(), tmp_path, file_roots=[]) as ingest:
        async with client(ingest) as http:
            for i, (url, needle) in enumerate(_evil_urls(listener.port, key_file)):
                reason = await _refused(ingest, http, {"id": f"evil-{i}", "url": url})
                assert needle in reason and reason.startswith("url: "), (url, reason)
                assert url not in reason and "passwd" not in reason
                assert "signing" not in reason and "ANYLINE" not in reason
    assert listener.connections == 0


EVIL_OPTIONS = [
    ({"method": "POST"}, "'method' is not allowed"),
    ({"post_data": "SET pwned 1"}, "'post_data' is not allowed"),
    (
        {"headers": "X-A: 1\r\nHost: redis\r\n\r\nSET pwned 1"},
        "'headers': value contains a control",
    ),
    ({"headers": "Host: 169.254.169.254"}, "'headers': expected one 'Name: value' header"),
    ({"protocol_whitelist": "http,tcp,file,gopher,concat"}, "'protocol_whitelist' is not allowed"),
    ({"protocol_blacklist": "none"}, "'protocol_blacklist' is not allowed"),
    ({"http_proxy": "http://127.0.0.1:1"}, "'http_proxy' is not allowed"),
    ({"ca_file": "/etc/passwd"}, "'ca_file' is not allowed"),
    ({"listen": "1"}, "'listen' is not allowed"),
    ({"rtsp_flags": "listen"}, "'rtsp_flags': not one of the values"),
    ({"user_agent": "x\r\nX-Injected: 1"}, "'user_agent': value contains a control"),
]


@pytest.mark.parametrize(
    ("options", "needle"), EVIL_OPTIONS, ids=[next(iter(o)) for o, _ in EVIL_OPTIONS]
)
async def test_evil_options_are_refused_naming_the_key_and_reach_nothing(
    tmp_path: Path, listener: CountingListener, options: dict[str, str], needle: str
) -> None:
    async with running_ingest(ed_keys(), tmp_path) as ingest, client(ingest) as http:
        body = {"id": "evil", "url": f"http://127.0.0.1:{listener.port}/x", "options": options}
        reason = await _refused(ingest, http, body)
        assert reason.startswith("options: ") and needle in reason, reason
        assert all(v not in reason for v in options.values())
    assert listener.connections == 0


async def test_the_listener_counts_an_allowed_source_and_safe_options_pass(
    tmp_path: Path, listener: CountingListener
) -> None:
    """The positive control: the same URL with harmless options is added and connects."""

    async with running_ingest(ed_keys(), tmp_path) as ingest, client(ingest) as http:
        options = {"user_agent": "cam-agent/1", "headers": "X-Api-Key: k", "timeout": "2000000"}
        body = {"id": "ok", "url": f"http://127.0.0.1:{listener.port}/x", "options": options}
        r = await http.post("/v1/streams", json=body, headers=ingest.auth(*WRITE))
        assert r.status_code == 201, r.text
        await wait_until_async(lambda: listener.connections > 0, 20, "the source connects")


DENIED = [
    "http://169.254.169.254/latest/meta-data/",
    "rtsp://169.254.169.254:554/x",
    "http://2852039166/latest/meta-data/",  # 169.254.169.254 as one number
    "http://[::ffff:169.254.169.254]/x",
    "rtmp://100.100.100.200/latest",
    "https://[fe80::1]/x",
]


async def test_metadata_and_link_local_hosts_are_refused_by_default(tmp_path: Path) -> None:
    async with running_ingest(ed_keys(), tmp_path) as ingest, client(ingest) as http:
        for i, url in enumerate(DENIED):
            reason = await _refused(ingest, http, {"id": f"md-{i}", "url": url})
            assert "FRAMERELAY_INGEST_SOURCE_DENIED_NETWORKS refuses" in reason, (url, reason)


async def test_loopback_is_refused_when_the_operator_denies_it(
    tmp_path: Path, listener: CountingListener
) -> None:
    denied = ["127.0.0.0/8", "::1/128"]

    async with (
        running_ingest(ed_keys(), tmp_path, source_denied_networks=denied) as ingest,
        client(ingest) as http,
    ):
        for i, host in enumerate(("127.0.0.1", "localhost", "127.1", "[::1]")):
            url = f"http://{host}:{listener.port}/x"
            reason = await _refused(ingest, http, {"id": f"lo-{i}", "url": url})
            assert "SOURCE_DENIED_NETWORKS" in reason, (url, reason)
    assert listener.connections == 0


async def test_files_over_the_api_only_under_the_roots_and_no_existence_oracle(
    tmp_path: Path,
    media: Media,  # noqa: F811
) -> None:
    root = tmp_path / "videos"
    root.mkdir()
    shutil.copy(media.short("mp4"), root / "clip.mp4")
    (root / "notes.mp4").write_text("root:x:0:0:root:/root:/bin/bash\n")
    key_file = _key_file(tmp_path)
    (root / "link.mp4").symlink_to(key_file)

    async with running_ingest(ed_keys(), tmp_path, file_roots=[root]) as ingest:
        async with client(ingest) as http:
            outside = [str(key_file), f"{root}/../secrets/signing.jwks", "/etc/passwd"]
            for i, url in enumerate([*outside, str(root / "link.mp4")]):
                reason = await _refused(ingest, http, {"id": f"out-{i}", "url": url})
                assert "not under FRAMERELAY_INGEST_FILE_ROOTS" in reason, reason
            await _added_under_the_root(ingest, http, root)


async def _added_under_the_root(ingest: Ingest, http: httpx.AsyncClient, root: Path) -> None:
    """A clip under the root plays; a missing file and a non-video one fail alike."""
    auth = ingest.auth(*WRITE)
    for sid, name in (("clip", "clip.mp4"), ("missing", "none.mp4"), ("notes", "notes.mp4")):
        body = {"id": sid, "url": str(root / name)}
        assert (await http.post("/v1/streams", json=body, headers=auth)).status_code == 201
    streams = ingest.service.streams
    await wait_until_async(lambda: streams["clip"].counters["decoded"] > 0, 20, "the clip decodes")
    failed = ("missing", "notes")
    await wait_until_async(
        lambda: all(streams[s].state.value == "FAILED" for s in failed), 20, "fail"
    )
    errors = {
        (await http.get(f"/v1/streams/{sid}", headers=auth)).json()["error"].split(": ", 1)[1]
        for sid in failed
    }
    assert errors == {
        "not a readable video file (missing, unreadable or holding no video: check the path, "
        "its permissions and the file)"
    }


def _playlist(segment: str) -> str:
    return (
        "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:10\n"
        f"#EXTINF:10.0,\n{segment}\n#EXT-X-ENDLIST\n"
    )


async def test_hls_segments_cannot_reach_files_or_other_protocols(
    tmp_path: Path,
    media: Media,  # noqa: F811
    listener: CountingListener,
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    clip = media.short("ts")
    shutil.copy(clip, site / "seg.ts")
    port = listener.port
    evil = {
        "file": f"file:{clip}",
        "path": str(clip),
        "concat": f"concat:{clip}|{clip}",
        "gopher": f"gopher://127.0.0.1:{port}/x.ts",
        "tcp": f"tcp://127.0.0.1:{port}/x.ts",
    }
    for name, segment in {**evil, "ok": "seg.ts"}.items():
        (site / f"{name}.m3u8").write_text(_playlist(segment))

    with http_server(site) as base:
        async with running_ingest(ed_keys(), tmp_path, file_roots=[]) as ingest:
            async with client(ingest) as http:
                auth = ingest.auth(*WRITE)
                for name in [*evil, "ok"]:
                    body = {"id": name, "url": f"{base}/{name}.m3u8", "max_retries": 0}
                    r = await http.post("/v1/streams", json=body, headers=auth)
                    assert r.status_code == 201, r.text
                await _hls_outcome(ingest, list(evil), int(base.rsplit(":", 1)[1]))
    assert listener.connections == 0


async def _hls_outcome(ingest: Ingest, evil: list[str], port: int) -> None:
    streams = ingest.service.streams
    await wait_until_async(
        lambda: streams["ok"].counters["decoded"] > 0, 30, "the HTTP segment plays"
    )
    await wait_until_async(
        lambda: all(streams[s].state.value == "FAILED" for s in evil), 30, "failed"
    )
    for sid in evil:
        described = streams[sid].describe()
        assert described["decoded"] == 0, sid
        reason = str(described["error"])
        assert f"cannot open http://127.0.0.1:{port}/{sid}.m3u8: " in reason, reason
        assert "segments outside http(s)://" in reason and "\n" not in reason, reason


@pytest.mark.parametrize(
    "url",
    ["tcp://127.0.0.1:{port}", "gopher://127.0.0.1:{port}/x", "concat:/etc/hostname|/etc/hosts"],
)
def test_every_open_carries_the_protocol_allowlist(listener: CountingListener, url: str) -> None:
    """A definition that never met the checks (a spec made directly, an old stored one)
    still opens nothing outside its scheme's protocols: FFmpeg's protocol_whitelist."""
    raw = url.format(port=listener.port)
    spec = SourceSpec(url=raw, display="x", open_timeout_s=2, read_timeout_s=2)
    with pytest.raises(SourceUnavailable) as info:
        AVSource(spec).session(threading.Event(), lambda _: None, lambda _: True)
    assert str(info.value).startswith("cannot open x: ")
    assert listener.connections == 0


async def test_config_file_streams_may_read_any_file(
    tmp_path: Path,
    media: Media,  # noqa: F811
) -> None:
    """The operator's own definitions (a --config file) are not held to the API's roots."""
    config = tmp_path / "cameras.yaml"
    config.write_text(f"streams:\n  - {{id: local, url: '{media.short('mp4')}', fps: 0}}\n")
    streams = load_streams(config, {})

    async with running_ingest(ed_keys(), tmp_path, file_roots=[], streams=streams) as ingest:
        stream = ingest.service.streams["local"]
        await wait_until_async(
            lambda: stream.counters["decoded"] > 0, 20, "the configured file plays"
        )


def test_the_defaults_and_the_environment_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    """Default: no file roots, link-local and metadata networks denied; env: JSON or lists."""
    monkeypatch.delenv("FRAMERELAY_INGEST_FILE_ROOTS", raising=False)
    defaults = IngestSettings()
    assert defaults.file_roots == []
    assert [str(n) for n in defaults.source_denied_networks] == [
        "169.254.0.0/16",
        "fe80::/10",
        "fd00:ec2::254/128",
        "100.100.100.200/32",
        "168.63.129.16/32",
    ]
    monkeypatch.setenv("FRAMERELAY_INGEST_FILE_ROOTS", "/srv/videos:/mnt/clips")
    monkeypatch.setenv("FRAMERELAY_INGEST_SOURCE_DENIED_NETWORKS", "169.254.0.0/16, 127.0.0.0/8")
    listed = IngestSettings()
    assert listed.file_roots == [Path("/srv/videos"), Path("/mnt/clips")]
    assert [str(n) for n in listed.source_denied_networks] == ["169.254.0.0/16", "127.0.0.0/8"]
    monkeypatch.setenv("FRAMERELAY_INGEST_FILE_ROOTS", '["/srv/a:b"]')
    monkeypatch.setenv("FRAMERELAY_INGEST_SOURCE_DENIED_NETWORKS", "[]")
    as_json = IngestSettings()
    assert as_json.file_roots == [Path("/srv/a:b")] and as_json.source_denied_networks == []
