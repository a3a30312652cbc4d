"""The orchestrator API and the CLI that talks to it (real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from redis import Redis

from tests.conftest import ROOT, TIMEOUT_FACTOR

pytestmark = pytest.mark.integration


@pytest.fixture
def orchestrator(secret: str) -> Iterator[str]:
    prefix = f"test-cli-{os.getpid()}-{time.monotonic_ns()}:"
    env = {
        **os.environ, "FRAMERELAY_TOKEN_SECRETS": secret, "FRAMERELAY_ORCH_KEY_PREFIX": prefix,
        "FRAMERELAY_ORCH_TIERS": json.dumps([{"name": "ondemand", "max_workers": 0}]),
        "FRAMERELAY_ORCH_TICK_S": "0.2",
    }  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "framerelay", "orchestrator", "--port", "0"],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    url = json.loads(line)["url"]
    try:
        yield url
    finally:
        httpx.delete(f"{url}/v1/streams/cli-cam")
        proc.terminate()
        proc.communicate(timeout=20 * TIMEOUT_FACTOR)
        redis = Redis()
        for key in redis.scan_iter(match=prefix + "*"):
            redis.delete(key)
        redis.close()


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "framerelay", *args, "--url", url],
        cwd=ROOT, capture_output=True, text=True, timeout=60 * TIMEOUT_FACTOR, check=False,
    )  # fmt: skip


def test_cli_streams_pods_fleet(orchestrator: str) -> None:
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
    metrics = httpx.get(f"{orchestrator}/metrics").text
    assert 'framerelay_orch_streams{placed="no"} 1.0' in metrics
    assert "framerelay_orch_cost_per_stream_hour_usd" in metrics
    assert cli(orchestrator, "streams", "rm", "cli-cam").returncode == 0


def test_cli_without_an_orchestrator_says_what_to_do() -> None:
    out = cli("http://127.0.0.1:9", "fleet", "status")
    assert out.returncode == 2 and "is `framerelay orchestrator` running?" in out.stderr
