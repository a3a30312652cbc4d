"""The orchestrator API and the CLI that talks to it (real processes).

The CLI sends a bearer token: ``FRAMERELAY_TOKEN`` / ``--token-file``, or one
it mints from ``FRAMERELAY_SIGNING_KEYS_FILE``; it verifies an https
orchestrator with ``--ca``. Refusals and TLS failures are one actionable line."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from redis import Redis

from framerelay.auth import KeySet
from tests.conftest import ROOT, TIMEOUT_FACTOR
from tests.support.auth import ed_keys, mint

pytestmark = pytest.mark.integration
BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith("FRAMERELAY_")}


@dataclass
class Orch:
    url: str
    keys: KeySet
    keys_file: Path
    ca: Path | None = None

    def token(self, *scopes: str) -> str:
        return mint(self.keys, scopes or ("fleet:read", "fleet:write"), "orchestrator")


def _start(tmp: Path, *, tls: bool) -> Iterator[Orch]:
    keys = ed_keys()
    keys_file = tmp / "signing.jwks"
    keys_file.write_text(keys.to_json())
    keys_file.chmod(0o600)
    prefix = f"test-cli-{os.getpid()}-{time.monotonic_ns()}:"
    env = {
        **BASE_ENV, "FRAMERELAY_SIGNING_KEYS_FILE": str(keys_file),
        "FRAMERELAY_ORCH_KEY_PREFIX": prefix, "FRAMERELAY_ORCH_CA_DIR": str(tmp / "ca"),
        "FRAMERELAY_ORCH_TIERS": json.dumps([{"name": "ondemand", "max_workers": 0}]),
        "FRAMERELAY_ORCH_TICK_S": "0.2",
    }  # fmt: skip
    ca = None
    if tls:  # the API's own certificate, from the deployment's CA (the pods' too)
        for cmd in (("ca", "init", "--dir", str(tmp / "ca")),
                    ("ca", "issue", "--dir", str(tmp / "ca"), "--name", "localhost", "--ip",
                     "127.0.0.1", "--out", str(tmp / "api"))):  # fmt: skip
            made = _framerelay(env, *cmd)
            assert made.returncode == 0, made.stderr
        ca = tmp / "ca" / "ca.pem"
        env["FRAMERELAY_ORCH_TLS_CERT"] = str(tmp / "api.pem")
        env["FRAMERELAY_ORCH_TLS_KEY"] = str(tmp / "api.key")
    proc = subprocess.Popen(
        [sys.executable, "-m", "framerelay", "orchestrator", "--port", "0"],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    url = json.loads(proc.stdout.readline())["url"]
    orch = Orch(url, keys, keys_file, ca)
    try:
        yield orch
    finally:
        auth = {"Authorization": f"Bearer {orch.token()}"}
        verify = ssl.create_default_context(cafile=str(ca)) if ca else True
        httpx.delete(f"{url}/v1/streams/cli-cam", headers=auth, verify=verify)
        proc.terminate()
        proc.communicate(timeout=20 * TIMEOUT_FACTOR)
        redis = Redis()
        for key in redis.scan_iter(match=prefix + "*"):
            redis.delete(key)
        redis.close()


@pytest.fixture
def orchestrator(tmp_path: Path) -> Iterator[Orch]:
    yield from _start(tmp_path, tls=False)


@pytest.fixture
def https_orchestrator(tmp_path: Path) -> Iterator[Orch]:
    yield from _start(tmp_path, tls=True)


def _framerelay(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "framerelay", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60 * TIMEOUT_FACTOR,
        check=False,
    )  # fmt: skip


def cli(orch: Orch, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The CLI as an operator who holds the keys runs it (it mints its own token)."""
    base = {**BASE_ENV, "FRAMERELAY_SIGNING_KEYS_FILE": str(orch.keys_file)}
    return _framerelay({**base, **env}, *args, "--url", orch.url)


def bare(orch: Orch, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The CLI without any key: only what ``env`` gives it."""
    return _framerelay({**BASE_ENV, **env}, *args, "--url", orch.url)


def test_cli_streams_pods_fleet(orchestrator: Orch) -> None:
    out = cli(orchestrator, "streams", "add", "cli-cam", "rtsp://cam/1", "--priority", "critical")
    assert out.returncode == 0 and "added cli-cam (critical" in out.stdout, out.stderr
    again = cli(orchestrator, "streams", "add", "cli-cam", "rtsp://cam/1")
    assert again.returncode == 2 and "409" in again.stderr
    ls = cli(orchestrator, "streams", "ls")
    assert "cli-cam" in ls.stdout and "critical" in ls.stdout
    status = cli(orchestrator, "fleet", "status")
    assert status.returncode == 0
    assert "TIER" in status.stdout and "unplaced streams: cli-cam" in status.stdout
    assert "saving vs all on-demand" in status.stdout
    assert cli(orchestrator, "pods", "list").stdout.startswith("POD")
    bad = cli(orchestrator, "pods", "create", "--tier", "nope")
    assert bad.returncode == 2 and "no tier 'nope'" in bad.stderr
    metrics = httpx.get(f"{orchestrator.url}/metrics").text  # open by default
    assert 'framerelay_orch_streams{placed="no"} 1.0' in metrics
    assert "framerelay_orch_cost_per_stream_hour_usd" in metrics
    assert cli(orchestrator, "streams", "rm", "cli-cam").returncode == 0


def test_cli_without_a_token_says_how_to_get_one(orchestrator: Orch) -> None:
    out = bare(orchestrator, "streams", "add", "cli-cam", "rtsp://cam/1")
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()  # one line, no traceback
    assert "HTTP 401" in line and "FRAMERELAY_TOKEN" in line and "--token-file" in line
    assert (
        "cli-cam"
        not in httpx.get(
            f"{orchestrator.url}/v1/streams",
            headers={"Authorization": f"Bearer {orchestrator.token('fleet:read')}"},
        ).text
    )


def test_cli_token_from_env_and_file_and_a_missing_scope(
    orchestrator: Orch, tmp_path: Path
) -> None:
    reader = orchestrator.token("fleet:read")
    ls = bare(orchestrator, "streams", "ls", FRAMERELAY_TOKEN=reader)
    assert ls.returncode == 0 and ls.stdout.startswith("STREAM"), ls.stderr
    add = bare(orchestrator, "streams", "add", "cli-cam", "rtsp://cam/1", FRAMERELAY_TOKEN=reader)
    assert add.returncode == 2
    (line,) = add.stderr.strip().splitlines()
    assert "HTTP 403" in line and "fleet:write" in line and reader not in line
    token_file = tmp_path / "token"
    token_file.write_text(orchestrator.token() + "\n")
    ok = bare(orchestrator, "streams", "add", "cli-cam", "rtsp://cam/1", "--token-file",
              str(token_file))  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    stranger = mint(ed_keys(), ["fleet:*"], "orchestrator")  # a key this orchestrator never had
    forged = bare(orchestrator, "fleet", "status", FRAMERELAY_TOKEN=stranger)
    assert forged.returncode == 2 and "token was refused" in forged.stderr


def test_cli_over_https_with_the_ca(https_orchestrator: Orch, tmp_path: Path) -> None:
    orch = https_orchestrator
    assert orch.url.startswith("https://127.0.0.1:") and orch.ca is not None
    ok = cli(orch, "fleet", "status", "--ca", str(orch.ca))
    assert ok.returncode == 0 and "TIER" in ok.stdout, ok.stderr
    via_env = cli(orch, "pods", "list", FRAMERELAY_ORCH_CA_FILE=str(orch.ca))
    assert via_env.returncode == 0, via_env.stderr
    unverified = cli(orch, "fleet", "status")  # the system CAs do not know the pod CA
    assert unverified.returncode == 2
    (line,) = unverified.stderr.strip().splitlines()
    assert "TLS verification" in line and "--ca" in line
    missing = cli(orch, "fleet", "status", "--ca", str(tmp_path / "nope.pem"))
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


def test_cli_without_an_orchestrator_says_what_to_do(tmp_path: Path) -> None:
    out = _framerelay(BASE_ENV, "fleet", "status", "--url", "http://127.0.0.1:9")
    assert out.returncode == 2 and "is `framerelay orchestrator` running?" in out.stderr
