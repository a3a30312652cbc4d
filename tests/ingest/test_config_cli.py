"""``framerelay ingest --config`` as a user runs it: real CLI processes, real API.

A bad camera file exits 2 with one line on stderr (file, stream, field), no
traceback and no secret; a good YAML or TOML file starts its cameras, listed by
the API, in place of ``FRAMERELAY_INGEST_STREAMS``, with a definition stored
over the API winning over the file's (README "Cameras and other sources").
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from ingest.settings import StreamConfig
from ingest.store import FileStore
from tests.conftest import ROOT, TIMEOUT_FACTOR
from tests.support.auth import mint
from tests.support.cli_runs import Run, clean_env, run_all
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
KEY = "config-file-secret-config-file-secret-0123456789"
PASSWORD = "cam-pass-do-not-print-7f3a"
NOBODY = "ws://127.0.0.1:9/v1/tunnel"  # no worker: streams decode, the tunnel retries


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    return clean_env(FRAMERELAY_TOKEN_SECRETS=KEY, CAM_PASS=PASSWORD,
                     FRAMERELAY_INGEST_STORE_PATH=str(tmp / "streams.json"), **extra)  # fmt: skip


def _ingest_args(*extra: str) -> list[str]:
    return ["ingest", "--api-port", "0", "--worker-url", NOBODY, *extra]


# (file name, contents or None for no file, extra arguments, words the one line holds)
BAD: dict[str, tuple[str, str | None, tuple[str, ...], tuple[str, ...]]] = {
    "missing": ("none.yaml", None, (), ("--config", "none.yaml", "cannot read it", "No such file")),
    "not YAML": (
        "c.yaml", f'streams:\n  - id: a\n    url: a.mp4\n    password: "{PASSWORD}\n', (),
        ("c.yaml", "not valid YAML", "line")),
    "not TOML": ("c.toml", f"[[streams]]\npassword = {PASSWORD}\n", (),
                 ("c.toml", "not valid TOML", "line 2")),
    "unknown field": (
        "c.yaml", "streams:\n  - {id: cam-1, url: a.mp4}\n  - {id: cam-2, url: b.mp4, fsp: 2}\n",
        (), ("c.yaml", "stream 2 (id cam-2)", "fsp", "did you mean 'fps'?")),
    "bad value": ("c.toml", '[[streams]]\nid = "cam-1"\nurl = "a.mp4"\nfps = -2\n', (),
                  ("stream 1 (id cam-1)", "fps: Input should be greater than or equal to 0")),
    "unknown format": ("cams.ini", "[cams]\n", (), ("unknown format '.ini'",)),
    "duplicate id": ("c.yaml", "streams:\n  - {id: a, url: a.mp4}\n  - {id: a, url: b.mp4}\n",
                     (), ("stream 2 (id a)", "ids must be unique")),
    "id clashes with --source": (
        "c.yaml", "streams:\n  - {id: stream-1, url: a.mp4}\n", ("--source", "b.mp4"),
        ("stream id stream-1 is given twice", "--source and --config")),
    "password_env unset": (
        "c.yaml", "streams:\n  - {id: a, url: rtsp://cam/s, username: u, password_env: NOPE}\n",
        (), ("stream 1 (id a)", "password_env", "NOPE is not set")),
    "credentials twice": (
        "c.yaml", f"streams:\n  - {{id: a, url: 'rtsp://u:{PASSWORD}@cam/s', username: u}}\n",
        (), ("stream 1 (id a)", "credentials given twice")),
}  # fmt: skip


def _one_line(run: Run, *words: str) -> None:
    assert "Traceback" not in run.stderr, run.stderr[-1500:]
    assert PASSWORD not in run.stderr + run.stdout
    lines = run.stderr.strip().splitlines()
    assert run.rc == 2 and len(lines) == 1, (run.rc, run.stderr[-1500:])
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_every_bad_camera_file_is_one_line(tmp_path: Path) -> None:
    cases = []
    for name, (file, text, extra, _) in BAD.items():
        folder = tmp_path / name.replace(" ", "-")
        folder.mkdir()
        if text is not None:
            (folder / file).write_text(text)
        cases.append((_ingest_args("--config", str(folder / file), *extra), _env(folder)))
    runs: list[Run] = []
    for i in range(0, len(cases), 5):  # a few at a time: 2 cores, ~1 s of imports each
        runs += run_all(cases[i : i + 5])
    for (name, (*_, words)), run in zip(BAD.items(), runs, strict=True):
        try:
            _one_line(run, *words)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None


class Ingest:
    """A real ``framerelay ingest`` on a free port, its API URL read from its ready line."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "framerelay", *args], env=env, cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        token = mint(KEY, ["streams:read"], "ingest", ttl=600)
        self.auth = {"Authorization": f"Bearer {token}"}
        self.lines: list[str] = []
        self.base = ""

    def ready(self) -> Ingest:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + 30 * TIMEOUT_FACTOR
        while time.monotonic() < deadline and not self.base:
            line = self.proc.stderr.readline()
            assert line, f"the ingest exited: {''.join(self.lines)[-2000:]}"
            self.lines.append(line)
            if "ingest API listening on " in line:
                self.base = line.split("listening on ", 1)[1].split(";", 1)[0].strip()
        assert self.base, "no ready line"
        return self

    def get(self, path: str) -> Any:
        answer = httpx.get(f"{self.base}{path}", headers=self.auth, timeout=10)
        assert answer.status_code == 200, answer.text
        assert PASSWORD not in answer.text
        return answer.json()

    def stop(self) -> str:
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=30 * TIMEOUT_FACTOR)
        return "".join(self.lines) + err


@pytest.fixture
def toml_file(tmp_path: Path) -> Path:
    """The TOML sample plus a camera whose password comes from $CAM_PASS."""
    text = (ROOT / "samples" / "cameras.toml").read_text()
    text += (
        '\n[[streams]]\nid = "lobby"\nurl = "rtsp://127.0.0.1:9/none"\nusername = "viewer"\n'
        'password_env = "CAM_PASS"\nmax_retries = 1000\n'
    )
    path = tmp_path / "cameras.toml"
    path.write_text(text)
    return path


@pytest.fixture
async def stored(tmp_path: Path) -> Path:
    """A stream store where 'campus' was changed over the API (fps 1)."""
    store = tmp_path / "store"
    store.mkdir()
    config = StreamConfig(id="campus", url=str(ROOT / "samples/mot15/TUD-Campus/TUD-Campus.mp4"),
                          fps=1, realtime=True, loop=True)  # fmt: skip
    await FileStore(store / "streams.json").put(config)
    return store


async def test_yaml_and_toml_files_start_their_cameras(
    tmp_path: Path, toml_file: Path, stored: Path
) -> None:
    env_streams = '[{"id": "from-env", "url": "x.mp4"}]'
    runs = [
        Ingest(_ingest_args("--config", "samples/cameras.yaml"),
               _env(tmp_path, FRAMERELAY_INGEST_STREAMS=env_streams)),
        Ingest(_ingest_args("--config", str(toml_file)), _env(stored)),
    ]  # fmt: skip
    try:
        yaml_, toml_ = (run.ready() for run in runs)
        assert {s["id"] for s in yaml_.get("/v1/streams")} == {"stadtmitte", "campus"}
        assert {s["id"] for s in toml_.get("/v1/streams")} == {"stadtmitte", "campus", "lobby"}
        campus = yaml_.get("/v1/streams/campus")["config"]
        assert (campus["fps"], campus["read_timeout_s"], campus["loop"]) == (2.0, 5.0, True)
        assert toml_.get("/v1/streams/campus")["config"]["fps"] == 1.0  # the stored one wins
        lobby = toml_.get("/v1/streams/lobby")["config"]
        assert (lobby["username"], lobby["password"], lobby["fps"]) == ("viewer", "***", 5.0)
        _until_running(yaml_, "stadtmitte")
    finally:
        said = [run.stop() for run in runs]
    for out in said:
        assert "Traceback" not in out and PASSWORD not in out, out[-2000:]
    assert "2 configured stream(s)" in said[0] and "3 configured stream(s)" in said[1]


def _until_running(ingest: Ingest, sid: str) -> None:
    state = ""

    def running() -> bool:
        nonlocal state
        state = str(ingest.get(f"/v1/streams/{sid}")["state"])
        return state == "RUNNING"

    wait_until(running, 20, lambda: f"{sid} is {state}, not RUNNING", every_s=0.2)
