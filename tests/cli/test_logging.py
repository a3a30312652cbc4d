"""``--log-level`` / ``--log-format json`` on every command, before or after the
sub-command, and as FRAMERELAY_LOG_LEVEL / FRAMERELAY_LOG_FORMAT; every service says
where it listens and what it loaded; no httpx INFO lines (real processes)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from redis import Redis

from framerelay.data import DEFAULT_MODEL
from tests.conftest import ROOT, TIMEOUT_FACTOR
from tests.support.cli_runs import clean_env, run_all

pytestmark = pytest.mark.integration
SECRET = "cli-logging-secret-cli-logging-secret-012345"
MISSING = "/nonexistent/keys.jwks"


@pytest.mark.parametrize(
    ("argv", "env", "debug"),
    [
        (["--log-level", "debug", "keys", "list", MISSING], {}, True),
        (["keys", "--log-level", "DEBUG", "list", MISSING], {}, True),
        (["keys", "list", MISSING, "--log-level", "debug"], {}, True),
        (["keys", "list", MISSING], {"FRAMERELAY_LOG_LEVEL": "debug"}, True),
        (["keys", "list", MISSING, "--log-level", "info"], {"FRAMERELAY_LOG_LEVEL": "debug"},
         False),
        (["keys", "list", MISSING], {}, False),
    ],
)  # fmt: skip
def test_log_level_anywhere_and_from_env(argv: list[str], env: dict[str, str], debug: bool) -> None:
    (run,) = run_all([(argv, clean_env(**env))])
    assert run.rc == 2 and run.stderr.strip().splitlines()[-1].startswith("framerelay: error:")
    assert ("Traceback" in run.stderr) is debug, run.stderr  # the traceback only at DEBUG


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["keys", "list", MISSING, "--log-format", "json", "--log-level", "debug"], {}),
        (["keys", "list", MISSING],
         {"FRAMERELAY_LOG_FORMAT": "JSON", "FRAMERELAY_LOG_LEVEL": "debug"}),
    ],
)  # fmt: skip
def test_json_format_from_flag_or_env(argv: list[str], env: dict[str, str]) -> None:
    (run,) = run_all([(argv, clean_env(**env))])
    *logged, last = run.stderr.strip().splitlines()
    assert run.rc == 2 and last.startswith("framerelay: error:")  # what the user reads
    records = [json.loads(line) for line in logged]  # every log line is one JSON object
    assert records and {"ts", "level", "logger", "msg"} <= set(records[0])
    assert any("Traceback" in r.get("exc", "") for r in records)


def _start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "framerelay", *cmd], env=env, cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _ready(proc: subprocess.Popen[str], name: str) -> dict[str, str]:
    """The JSON ready record of a service: ``<name> listening on ...``."""
    assert proc.stderr is not None
    deadline = time.monotonic() + 120 * TIMEOUT_FACTOR
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        assert line, f"{name} exited before it was ready"
        record: dict[str, str] = json.loads(line)  # --log-format json: every line
        if re.match(rf"{name}( \S+)? listening on ", record["msg"]):  # worker <id> listening
            return record
    raise AssertionError(f"{name} never said where it listens")


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    return proc.communicate(timeout=30 * TIMEOUT_FACTOR)[1]


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.communicate(timeout=10)


@pytest.fixture
def services(tmp_path: Path) -> Iterator[dict[str, subprocess.Popen[str]]]:
    prefix = f"test-logging-{os.getpid()}-{time.monotonic_ns()}:"
    env = clean_env(FRAMERELAY_TOKEN_SECRETS=SECRET, FRAMERELAY_LOG_FORMAT="json")
    procs = {
        "worker": _start(["worker", "--port", "0", "--model", str(DEFAULT_MODEL)], env),
        "ingest API": _start(["ingest", "--api-port", "0", "--source", "rtsp://127.0.0.1:9/x"],
                             {**env, "FRAMERELAY_INGEST_STORE_PATH": str(tmp_path / "s.json")}),
        "orchestrator API": _start(
            ["orchestrator", "--port", "0"],
            {**env, "FRAMERELAY_ORCH_KEY_PREFIX": prefix, "FRAMERELAY_ORCH_CA_DIR":
             str(tmp_path / "ca"), "FRAMERELAY_ORCH_TIERS": '[{"name": "od", "max_workers": 0}]'}),
    }  # fmt: skip
    with ExitStack() as stack:
        for proc in procs.values():
            stack.callback(_kill, proc)
        yield procs
    redis = Redis()
    for key in redis.scan_iter(match=prefix + "*"):
        redis.delete(key)
    redis.close()


def test_every_service_says_where_it_listens_and_what_it_loaded(
    services: dict[str, subprocess.Popen[str]],
) -> None:
    ready = {name: _ready(proc, name) for name, proc in services.items()}
    worker = ready["worker"]["msg"]
    assert "ws://127.0.0.1:" in worker and "model yolox_nano_416.onnx" in worker
    ingest = ready["ingest API"]["msg"]
    assert "http://127.0.0.1:" in ingest and "1 configured stream(s)" in ingest
    assert "stream store" in ingest and "worker ws://127.0.0.1:8443" in ingest
    orch = ready["orchestrator API"]["msg"]
    assert "http://127.0.0.1:" in orch and "provider local" in orch and "tiers od" in orch
    orch_url = orch.split("listening on ", 1)[1].split(";", 1)[0]
    env = clean_env(FRAMERELAY_TOKEN_SECRETS=SECRET)
    quiet, chatty = run_all(
        [
            (["fleet", "show", "--url", orch_url], env),
            (["fleet", "show", "--url", orch_url, "--log-level", "debug"], env),
        ]
    )
    assert quiet.rc == 0 and quiet.stderr == "", quiet.stderr  # no httpx INFO line
    assert chatty.rc == 0 and "HTTP Request: GET" in chatty.stderr  # ...but there at DEBUG
    for name, proc in services.items():
        said = _stop(proc)
        assert "HTTP Request" not in said and "Traceback" not in said, (name, said[-2000:])
        for line in said.splitlines():  # to the last line, uvicorn's too: JSON
            assert isinstance(json.loads(line), dict), (name, line)
