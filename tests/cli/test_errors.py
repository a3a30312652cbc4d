"""Every bad input of issue 13, as a new user types it: exit 2 (usage) or 1, exactly one
actionable line on stderr, never a traceback (real CLI processes, real sockets)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from framerelay.data import DEFAULT_MODEL
from framerelay.settings import ServiceSettings
from tests.conftest import CLIP, ROOT, TIMEOUT_FACTOR
from tests.support.auth import mint
from tests.support.cli_runs import Run, clean_env, run_all

pytestmark = pytest.mark.integration
SECRET = "cli-errors-secret-cli-errors-secret-0123456789"
KEYS = {"FRAMERELAY_TOKEN_SECRETS": SECRET}


def _one_line(run: Run, code: int, *words: str) -> None:
    assert "Traceback" not in run.stderr, run.stderr[-1500:]
    lines = run.stderr.strip().splitlines()
    assert run.rc == code and len(lines) == 1, (run.rc, run.stderr[-1500:])
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.fixture(scope="module")
def busy_port() -> Iterator[int]:
    """A port some other process (here: this one) already listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _files(tmp: Path) -> dict[str, str]:
    (tmp / "bad.json").write_text("nope{")
    (tmp / "unknown.json").write_text(json.dumps([{"id": "a", "url": "a.mp4", "bogus": 1}]))
    return {"missing": str(tmp / "none.json"), "bad": str(tmp / "bad.json"),
            "unknown": str(tmp / "unknown.json")}  # fmt: skip


# (argv, extra env, exit code, words the one line must hold)
Case = tuple[list[str], dict[str, str], int, tuple[str, ...]]


def _cases(tmp: Path, busy: int) -> dict[str, Case]:
    f = _files(tmp)
    store = {"FRAMERELAY_INGEST_STORE_PATH": str(tmp / "streams.json"), **KEYS}
    return {
        "demo --fps -3": (["demo", "--fps", "-3"], {}, 2, ("--fps", "greater than or equal to 0")),
        "demo --threads -2": (["demo", "--threads", "-2"], {}, 2, ("--threads", "-2")),
        "demo --console-port 99999": (["demo", "--console-port", "99999"], {}, 2,
                                      ("--console-port", "65535")),
        "demo --duration nan": (["demo", "--duration", "nan"], {}, 2,
                                ("--duration", "finite", "'nan'")),
        # float() took nan, and the orchestrator client failed on it as an unexpected
        # ValueError ("Out of range float values are not JSON compliant")
        "streams add --fps nan": (["streams", "add", "cam-1", "rtsp://cam/x", "--fps", "nan"],
                                  {}, 2, ("--fps", "finite", "'nan'")),
        "streams add --latency-slo-ms inf": (
            ["streams", "add", "cam-1", "rtsp://cam/x", "--latency-slo-ms", "inf"], {}, 2,
            ("--latency-slo-ms", "finite", "'inf'")),
        "streams add --max-lost-s nan": (
            ["streams", "add", "cam-1", "rtsp://cam/x", "--max-lost-s", "nan"], {}, 2,
            ("--max-lost-s", "finite", "'nan'")),
        "demo --tracker nosuch": (["demo", "--tracker", "nosuch"], {}, 2,
                                  ("'nosuch'", "bytetrack", "default")),
        "demo --model missing": (["demo", "--model", "/nonexistent.onnx"], {}, 2,
                                 ("cannot load the model", "/nonexistent.onnx")),
        "worker --port 99999": (["worker", "--port", "99999"], KEYS, 2,
                                ("FRAMERELAY_WORKER_PORT", "65535")),
        "worker --confidence 2": (["worker", "--confidence", "2"], KEYS, 2,
                                  ("confidence_threshold", "less than or equal to 1")),
        "FRAMERELAY_WORKER_PORT=abc": (["worker"], {"FRAMERELAY_WORKER_PORT": "abc", **KEYS}, 2,
                                       ("FRAMERELAY_WORKER_PORT", "integer")),
        "worker --model missing": (["worker", "--model", "/nonexistent.onnx"], KEYS, 2,
                                   ("cannot load the model", "/nonexistent.onnx")),
        "worker on a taken port": (["worker", "--port", str(busy)], KEYS, 2,
                                   (f"127.0.0.1:{busy}", "already in use", "--port")),
        "ingest on a taken port": (["ingest", "--api-port", str(busy)], store, 2,
                                   (f"127.0.0.1:{busy}", "already in use", "--api-port")),
        "orchestrator on a taken port": (["orchestrator", "--port", str(busy)], KEYS, 2,
                                         (f"127.0.0.1:{busy}", "already in use", "--port")),
        "streams file missing": (["ingest", "--streams-file", f["missing"]], store, 2,
                                 ("--streams-file", "cannot read", "No such file")),
        "streams file not JSON": (["ingest", "--streams-file", f["bad"]], store, 2,
                                  ("--streams-file", "not valid JSON", "line 1")),
        "streams file unknown field": (["ingest", "--streams-file", f["unknown"]], store, 2,
                                       ("stream 1", "bogus", "Extra inputs")),
        "FRAMERELAY_INGEST_STREAMS not JSON": (
            ["ingest"], {"FRAMERELAY_INGEST_STREAMS": "not json", **store}, 2,
            ("FRAMERELAY_INGEST_STREAMS", "not valid JSON")),
        "unknown ingest variable": (
            ["ingest"], {"FRAMERELAY_INGEST_TLS_CLIENT_CRT": "c.pem", **store}, 2,
            ("FRAMERELAY_INGEST_TLS_CLIENT_CRT", "did you mean FRAMERELAY_INGEST_TLS_CLIENT_CERT")),
        "unknown worker variable": (
            ["worker"], {"FRAMERELAY_WORKER_TLS_CRT": "c.pem", **KEYS}, 2,
            ("did you mean FRAMERELAY_WORKER_TLS_CERT",)),
        "another service's variable is not the worker's business": (
            ["worker", "--port", "99999"], {"FRAMERELAY_INGEST_TYPO": "1", **KEYS}, 2,
            ("FRAMERELAY_WORKER_PORT",)),
        "bad FRAMERELAY_LOG_LEVEL": (["keys", "list", "x"], {"FRAMERELAY_LOG_LEVEL": "loud"}, 2,
                                     ("FRAMERELAY_LOG_LEVEL", "DEBUG")),
    }  # fmt: skip


def test_every_bad_input_is_one_line(tmp_path: Path, busy_port: int) -> None:
    cases = _cases(tmp_path, busy_port)
    started = time.monotonic()
    runs = []
    items = list(cases.items())
    for i in range(0, len(items), 4):  # a few at a time: 2 cores, ~1 s of imports each
        batch = items[i : i + 4]
        runs += run_all([(argv, clean_env(**env)) for _, (argv, env, _, _) in batch])
    for (name, (_, _, code, words)), run in zip(items, runs, strict=True):
        try:
            _one_line(run, code, *words)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
    assert time.monotonic() - started < 90 * TIMEOUT_FACTOR  # every one of them fails at once


def test_a_missing_model_fails_at_once_not_after_a_timeout() -> None:
    """The demo refused --model /nonexistent.onnx with "did not become ready in 120 s"."""
    started = time.monotonic()
    (run,) = run_all([(["demo", "--model", "/nonexistent.onnx"], clean_env())])
    _one_line(run, 2, "cannot load the model")
    assert "120 s" not in run.stderr and time.monotonic() - started < 20 * TIMEOUT_FACTOR


def test_a_worker_that_exits_early_is_reported_as_such() -> None:
    """LocalWorker (the demo's, the orchestrator's local provider) says why, in one line."""
    from framerelay.errors import ConfigError
    from framerelay.launcher import LocalWorker

    worker = LocalWorker(SECRET, args=["--model", "/nonexistent.onnx"])
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        worker.start(timeout_s=120 * TIMEOUT_FACTOR)
    said = str(info.value)
    assert "exited (code 2)" in said and "cannot load the model" in said and "\n" not in said
    assert time.monotonic() - started < 30 * TIMEOUT_FACTOR


@pytest.mark.parametrize(
    ("settings", "environ", "words"),
    [
        ("ingest", {"FRAMERELAY_INGEST_RESULTS__QUEUE_SIZ": "9"},
         ("did you mean FRAMERELAY_INGEST_RESULTS__QUEUE_SIZE?",)),
        ("orchestrator", {"FRAMERELAY_ORCH_PROVDER": "local"},
         ("did you mean FRAMERELAY_ORCH_PROVIDER?",)),
        ("orchestrator", {"FRAMERELAY_ORCH_RUNPOD__API_KEY_FIL": "/k"},
         ("did you mean FRAMERELAY_ORCH_RUNPOD__API_KEY_FILE?",)),
        ("worker", {"FRAMERELAY_WORKER_DETECTOR__THREAD": "2"},
         ("did you mean FRAMERELAY_WORKER_DETECTOR__THREADS?",)),
        ("ingest", {"FRAMERELAY_INGEST_ZZZZZZZZ": "1"}, ("no FRAMERELAY_INGEST_* setting",)),
        ("recorder", {"FRAMERELAY_RECORD_SEGMNT_S": "5"},
         ("did you mean FRAMERELAY_RECORD_SEGMENT_S?",)),
    ],
)  # fmt: skip
def test_unknown_variables_name_the_nearest_setting(
    settings: str, environ: dict[str, str], words: tuple[str, ...]
) -> None:
    cls = _settings_class(settings)
    said = cls.env_problem(environ)
    assert said is not None and "\n" not in said
    for word in words:
        assert word in said
    for value in environ.values():
        assert value not in said  # names only, never values


@pytest.mark.parametrize("settings", ["ingest", "worker", "orchestrator"])
def test_known_shared_and_other_services_variables_are_accepted(settings: str) -> None:
    environ = {
        "FRAMERELAY_INGEST_RESULTS__QUEUE_SIZE": "9", "FRAMERELAY_INGEST_TOKEN_FILE": "/t",
        "FRAMERELAY_INGEST_REDIS_URL": "redis://x", "FRAMERELAY_WORKER_TUNNEL_KEYS_FILE": "/k",
        "FRAMERELAY_WORKER_DETECTOR__CLASS_NAMES": "[]", "FRAMERELAY_WORKER_FAULT": "x",
        "FRAMERELAY_WORKER_TRACKER": "x", "FRAMERELAY_ORCH_URL": "http://o",
        "FRAMERELAY_ORCH_CA_FILE": "/ca", "FRAMERELAY_ORCH_MODEL_COSTS__BIG": "2",
        "FRAMERELAY_ORCH_KUBERNETES__NODE_SELECTOR__GPU": "a100",
        "FRAMERELAY_ORCH_RUNPOD__API_KEY_FILE": "/k", "FRAMERELAY_TOKEN_SECRETS": "s",
        "FRAMERELAY_REDIS_URL": "redis://x", "FRAMERELAY_TIMEOUT_FACTOR": "2",
        "FRAMERELAY_LOG_LEVEL": "DEBUG", "FRAMERELAY_RECORD_TYPO": "1",
    }  # fmt: skip
    assert _settings_class(settings).env_problem(environ) is None


def _settings_class(name: str) -> type[ServiceSettings]:
    from deploy.settings import OrchestratorSettings
    from gpu_worker.settings import WorkerSettings
    from ingest.recording.settings import RecorderSettings
    from ingest.settings import IngestSettings

    classes: dict[str, type[ServiceSettings]] = {
        "ingest": IngestSettings, "worker": WorkerSettings, "orchestrator": OrchestratorSettings,
        "recorder": RecorderSettings,
    }  # fmt: skip
    return classes[name]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["demo", "--fps", "abc"], ("framerelay demo: error:", "invalid float")),
        (["streams", "add", "cam-1"], ("required: URL", "framerelay streams add --help")),
        (["demo", "--log-format", "xml"], ("--log-format", "text, json")),
        (["nosuch"], ("invalid choice",)),
    ],
)
def test_usage_errors_are_one_line(
    argv: list[str], words: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    from framerelay.cli import build_parser

    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2
    for word in words:
        assert word in line


# ---- the ingest against a TLS worker: it keeps running, the error says what to change ----


@pytest.fixture(scope="module")
def mtls_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A worker serving wss:// that requires client certificates: (wss URL, CA file)."""
    import trustme

    tmp = tmp_path_factory.mktemp("mtls")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp / "server.pem"))
    cert.private_key_pem.write_to_path(str(tmp / "server.key"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "framerelay", "worker", "--announce", "--port", "0",
         "--model", str(DEFAULT_MODEL), "--tls-cert", str(tmp / "server.pem"),
         "--tls-key", str(tmp / "server.key"), "--tls-client-ca", str(tmp / "ca.pem")],
        env=clean_env(**KEYS), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        url = json.loads(proc.stdout.readline())["url"]
        yield url, tmp / "ca.pem"
    finally:
        proc.terminate()
        proc.communicate(timeout=20 * TIMEOUT_FACTOR)


def _ingest(tmp: Path, url: str, *extra: str) -> subprocess.Popen[str]:
    env = clean_env(**KEYS, FRAMERELAY_INGEST_STORE_PATH=str(tmp / "streams.json"))
    return subprocess.Popen(
        [sys.executable, "-m", "framerelay", "ingest", "--api-port", "0", "--worker-url", url,
         "--source", str(CLIP), "--loop", "--realtime", *extra],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _api_url(proc: subprocess.Popen[str]) -> str:
    assert proc.stderr is not None
    deadline = time.monotonic() + 30 * TIMEOUT_FACTOR
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        assert line, "the ingest exited"
        if "ingest API listening on " in line:
            return line.split("listening on ", 1)[1].split(";", 1)[0]
    raise AssertionError("the ingest never said where it listens")


def _shown(api: str, path: str, want: str) -> str:
    """The JSON at ``path`` once it holds ``want``."""
    token = mint(SECRET, ["streams:read"], "ingest")
    deadline = time.monotonic() + 30 * TIMEOUT_FACTOR
    said = ""
    while time.monotonic() < deadline:
        got = httpx.get(f"{api}{path}", headers={"Authorization": f"Bearer {token}"})
        said = json.dumps(got.json())
        if want in said:
            return said
        time.sleep(0.3)
    raise AssertionError(f"{want!r} never in {said}")


@pytest.mark.parametrize(
    ("scheme", "want"),
    [
        pytest.param("ws", "use wss://", id="ws:// to a TLS worker"),
        pytest.param("wss", "client certificate", id="mTLS without a client certificate"),
    ],
)
def test_the_ingest_keeps_running_and_says_what_to_change(
    mtls_worker: tuple[str, Path], tmp_path: Path, scheme: str, want: str
) -> None:
    wss, ca = mtls_worker
    url = wss if scheme == "wss" else "ws://" + wss.removeprefix("wss://")
    proc = _ingest(tmp_path, url, "--tls-ca", str(ca))
    try:
        api = _api_url(proc)
        said = _shown(api, "/v1/workers", want)
        assert "--tls-client-cert" in said if scheme == "wss" else "--tls-ca" in said
        stream = json.loads(_shown(api, "/v1/streams/stream-1", want))
        assert want in stream["last_error"] and stream["sent"] == 0
        assert proc.poll() is None, "the ingest exited"  # the stream waits, the API answers
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20 * TIMEOUT_FACTOR)
    assert "Traceback" not in err, err[-2000:]
