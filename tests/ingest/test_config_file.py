"""Camera files (``framerelay ingest --config``): what loads, what is refused and how it
is said (one line: file, stream number and id, field; never a value), and that loading
grows linearly with the cameras (how long 500 take is ``bench/config_load.py``'s figure).
The real CLI runs in ``test_config_cli.py``."""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path

import pytest

from bench.rig.camera_files import FORMATS, PASSWORD_ENV, camera_file
from framerelay.errors import ConfigError
from ingest.config_file import load_streams
from ingest.settings import StreamConfig
from tests.conftest import ROOT

SECRET = "hunter2-do-not-print"
ENV = {PASSWORD_ENV: SECRET}


def _load(tmp: Path, name: str, text: str) -> list[StreamConfig]:
    path = tmp / name
    path.write_text(text)
    return load_streams(path, ENV)


def test_the_samples_load_alike_in_yaml_and_toml() -> None:
    yaml_ = load_streams(ROOT / "samples" / "cameras.yaml", {})
    toml_ = load_streams(ROOT / "samples" / "cameras.toml", {})
    assert yaml_ == toml_
    assert [(s.id, s.fps, s.read_timeout_s) for s in yaml_] == [
        ("stadtmitte", 5.0, 5.0),
        ("campus", 2.0, 5.0),
    ]


GOOD = {
    "yaml": (
        "cams.yaml",
        "defaults: {fps: 3, username: viewer, password_env: CAM_PASS}\n"
        "streams:\n"
        "  - {id: a, url: rtsp://10.0.0.1/s}\n"
        "  - {id: b, url: rtsp://10.0.0.2/s, fps: 1, password: other}\n"
        "  - {id: c, url: c.mp4, username: null, password: null}\n",
    ),
    "yml, anchors": (
        "cams.yml",
        "streams:\n"
        "  - &cam {id: a, url: rtsp://10.0.0.1/s, fps: 3, username: viewer,"
        " password_env: CAM_PASS}\n"
        "  - {<<: *cam, id: b, url: rtsp://10.0.0.2/s, fps: 1, password_env: null,"
        " password: other}\n"
        "  - {id: c, url: c.mp4}\n",
    ),
    "toml": (
        "cams.toml",
        '[defaults]\nfps = 3\nusername = "viewer"\npassword_env = "CAM_PASS"\n'
        '[[streams]]\nid = "a"\nurl = "rtsp://10.0.0.1/s"\n'
        '[[streams]]\nid = "b"\nurl = "rtsp://10.0.0.2/s"\nfps = 1\npassword = "other"\n'
        '[[streams]]\nid = "c"\nurl = "c.mp4"\nfps = 5\n',
    ),
    "json": (
        "cams.json",
        json.dumps(
            {
                "defaults": {"fps": 3, "username": "viewer", "password_env": "CAM_PASS"},
                "streams": [
                    {"id": "a", "url": "rtsp://10.0.0.1/s"},
                    {"id": "b", "url": "rtsp://10.0.0.2/s", "fps": 1, "password": "other"},
                    {"id": "c", "url": "c.mp4", "username": None, "password": None, "fps": 5},
                ],
            }
        ),
    ),
}


@pytest.mark.parametrize("case", GOOD, ids=list(GOOD))
def test_defaults_and_password_env_fill_in_each_stream(tmp_path: Path, case: str) -> None:
    name, text = GOOD[case]
    a, b, c = _load(tmp_path, name, text)
    assert (a.id, a.fps, a.username) == ("a", 3.0, "viewer")
    assert a.password is not None and a.password.get_secret_value() == SECRET
    assert b.fps == 1.0 and b.password is not None and b.password.get_secret_value() == "other"
    if case != "toml":  # TOML has no null: there a stream cannot unset a default
        assert c.password is None and c.username is None
    assert SECRET not in repr(a) and SECRET not in json.dumps(a.public())


def test_a_bare_list_is_the_streams(tmp_path: Path) -> None:
    (cfg,) = _load(tmp_path, "list.yaml", "- {id: cam-1, url: a.mp4, loop: true}\n")
    assert cfg.loop and cfg.id == "cam-1"


# (file name, contents, words the one line holds)
BAD: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "unknown field": (
        "c.yaml", "streams:\n  - {id: a, url: a.mp4}\n  - {id: cam-2, url: b.mp4, fsp: 5}\n",
        ("c.yaml", "stream 2 (id cam-2)", "fsp", "Extra inputs", "did you mean 'fps'?")),
    "bad value, the 422's words": (
        "c.toml", '[[streams]]\nid = "a"\nurl = "a.mp4"\nfps = 999\n',
        ("stream 1 (id a)", "fps: Input should be less than or equal to 240")),
    "nested field": (
        "c.yaml", "streams:\n  - {id: a, url: a.mp4, options: {Bad-Key: x}}\n",
        ("stream 1 (id a)", "options: bad FFmpeg option")),
    "bad value from defaults": (
        "c.yaml", "defaults: {fps: -1}\nstreams:\n  - {id: a, url: a.mp4}\n",
        ("stream 1 (id a)", "defaults.fps", "greater than or equal to 0")),
    "unknown default": (
        "c.yaml", "defaults: {relatime: true}\nstreams: []\n",
        ("defaults: relatime", "did you mean 'realtime'?")),
    "unknown top-level key": (
        "c.yaml", "stream:\n  - {id: a, url: a.mp4}\n", ("stream:", "did you mean 'streams'?")),
    "a service setting": (
        "c.toml", 'worker_url = "wss://gpu:8443/v1/tunnel"\n',
        ("worker_url: an ingest setting", "FRAMERELAY_INGEST_WORKER_URL")),
    "missing id": ("c.yaml", "streams:\n  - {url: a.mp4}\n", ("stream 1:", "id: Field required")),
    "bad id": ("c.yaml", "streams:\n  - {id: 'a b', url: a.mp4}\n", ("stream 1:", "id: String")),
    "duplicate id": (
        "c.yaml", "streams:\n  - {id: a, url: a.mp4}\n  - {id: a, url: b.mp4}\n",
        ("stream 2 (id a)", "stream 1 has this id already")),
    "duplicate key": (
        "c.yaml", "streams:\n  - id: a\n    url: a.mp4\n    fps: 1\n    fps: 2\n",
        ("not valid YAML", "duplicate key 'fps'", "line 5")),
    "duplicate key, JSON": (
        "c.json", '{"streams": [{"id": "a", "id": "b", "url": "a.mp4"}]}',
        ("not valid JSON", "duplicate key 'id'")),
    "YAML syntax on the password line": (
        "c.yaml", f'streams:\n  - id: a\n    url: a.mp4\n    password: "{SECRET}\n',
        ("not valid YAML", "line")),
    "TOML syntax": ("c.toml", f'[[streams]]\nid = "a"\npassword = {SECRET}\n',
                    ("not valid TOML", "line 3")),
    "JSON syntax": ("c.json", "{nope", ("not valid JSON", "line 1 column 2")),
    "unknown extension": ("c.ini", "[x]", ("unknown format '.ini'", ".yaml, .yml, .toml")),
    "not a mapping": ("c.yaml", "just text\n", ("expected a mapping", "a string")),
    "streams not a list": ("c.yaml", "streams: {id: a}\n", ("'streams' must be a list",)),
    "no streams": ("c.toml", "[defaults]\nfps = 1\n", ("'streams' must be a list", "nothing")),
    "entry not a mapping": ("c.yaml", "streams: [a.mp4]\n", ("stream 1:", "a mapping of fields")),
    "password and password_env": (
        "c.yaml", f"streams:\n  - {{id: a, url: a.mp4, username: u, password: {SECRET},"
        " password_env: CAM_PASS}\n", ("stream 1 (id a)", "password or password_env, not both")),
    "password_env unset": (
        "c.yaml", "defaults: {username: u, password_env: NO_SUCH_VAR}\nstreams: []\n",
        ("defaults.password_env", "NO_SUCH_VAR is not set")),
    "password_env not a name": (
        "c.yaml", "streams:\n  - {id: a, url: a.mp4, username: u, password_env: 'a b'}\n",
        ("stream 1 (id a)", "password_env: expected the name of an environment variable")),
    "password not a string": (
        "c.yaml", "streams:\n  - {id: a, url: a.mp4, username: u, password: 424242}\n",
        ("stream 1 (id a)", "password: Input should be a valid string")),
    "credentials twice": (
        "c.yaml", f"streams:\n  - {{id: a, url: 'rtsp://u:{SECRET}@cam/s', username: u}}\n",
        ("stream 1 (id a)", "credentials given twice")),
    "several bad streams": (
        "c.yaml", "streams:\n  - {id: a, url: a.mp4, fps: -1}\n  - {id: b}\n  - {id: c}\n",
        ("stream 1 (id a)", "fps", "(and 2 more invalid streams)")),
    "not UTF-8": ("c.yaml", "streams: [\udcff]", ("not UTF-8",)),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_a_bad_file_is_one_line_naming_where(tmp_path: Path, case: str) -> None:
    name, text, words = BAD[case]
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(ConfigError) as info:
        load_streams(path, ENV)
    said = str(info.value)
    assert "\n" not in said and said.startswith(f"--config {path}: "), said
    for word in words:
        assert word in said, (word, said)
    assert SECRET not in said and "424242" not in said


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cams\.yaml: cannot read it \(No such file"):
        load_streams(tmp_path / "cams.yaml", {})


SIZES = (100, 1000)
"""Two camera files 10x apart: loading that grows linearly takes about 10x the CPU time for
the larger (11-13x measured, idle and with two CPU hogs beside it), quadratic 100x."""
GROWTH_BOUND = 3 * SIZES[1] / SIZES[0]


def _written(tmp: Path, fmt: str, n: int) -> Path:
    path = tmp / f"cameras-{n}.{fmt}"
    path.write_text(camera_file(fmt, n))
    return path


def _cpu_s(path: Path, repeat: int = 5) -> float:
    """The least CPU time of ``repeat`` loads of ``path``: CPU time, so that other processes
    on the machine do not count; the garbage collector off while timing, so that this
    process's heap (every earlier test's) does not either."""
    least, collecting = float("inf"), gc.isenabled()
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            started = time.process_time()
            load_streams(path, ENV)
            least = min(least, time.process_time() - started)
        finally:
            if collecting:
                gc.enable()
    return least


@pytest.mark.parametrize("fmt", FORMATS)
def test_500_cameras_load_with_their_defaults(tmp_path: Path, fmt: str) -> None:
    streams = load_streams(_written(tmp_path, fmt, 500), ENV)
    assert len(streams) == 500 and len({s.id for s in streams}) == 500
    last = streams[-1]
    assert (last.id, last.fps, last.rtsp_transport, last.max_retries) == (
        "cam-0499",
        10.0,
        "udp",
        100,
    )
    assert last.password is not None and last.password.get_secret_value() == SECRET


@pytest.mark.parametrize("fmt", FORMATS)
def test_loading_grows_linearly_with_the_cameras(tmp_path: Path, fmt: str) -> None:
    """Ten times the cameras cost about ten times the CPU, far from a hundred. How long 500
    cameras take (the target: under a second) is ``bench/config_load.py``'s figure."""
    small, large = (_written(tmp_path, fmt, n) for n in SIZES)
    load_streams(small, ENV)  # parsers imported, caches warm
    small_s, large_s = _cpu_s(small), _cpu_s(large)
    ratio = large_s / small_s
    print(
        f"\n{fmt.upper()}: {SIZES[0]} cameras {small_s * 1000:.1f} ms CPU, {SIZES[1]} "
        f"{large_s * 1000:.1f} ms: x{ratio:.1f}"
    )
    assert ratio < GROWTH_BOUND, (small_s, large_s)
