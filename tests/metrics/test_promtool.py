"""Issue 13: every service's real ``/metrics`` passes ``promtool check metrics``.

Real processes: the session's worker, ``framerelay ingest`` on the sample clip
with Redis on (so the result hub and the Redis publisher expose their series
with values) and a subscriber that received results, and ``framerelay
orchestrator``. promtool (Debian's ``prometheus`` package, installed by
scripts/services.sh) must print nothing and exit 0: base units (seconds),
``_total`` counters, no abbreviated units.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from redis import Redis
from websockets.asyncio.client import connect

from framerelay.launcher import LocalWorker
from tests.conftest import CLIP, ROOT, TIMEOUT_FACTOR
from tests.support.auth import ed_keys, mint
from tests.support.promtool import promtool
from tests.support.servers import free_port

# sync tests on an async fixture: anyio sets it up only where anyio_backend is requested
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("anyio_backend")]
BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith("FRAMERELAY_")}
RENAMED = ("_ms", "_ms_bucket", "stream_hours", "framerelay_orch_fleet_usd", "source_events")


def samples(text: str, name: str) -> dict[str, float]:
    """``{labels: value}`` of one metric's samples in an exposition text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            series, value = line.rsplit(" ", 1)
            out[series[len(name) :]] = float(value)
    return out


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "framerelay", *args], env=env, cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


def _wait_http(url: str, what: str, log: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s * TIMEOUT_FACTOR
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-1500:]
    pytest.fail(f"{what} did not answer {url} in {timeout_s} s; its log ends:\n{tail}")


def _end(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20 * TIMEOUT_FACTOR)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _drop_keys(prefix: str) -> None:
    redis = Redis()
    for key in redis.scan_iter(match=prefix + "*"):
        redis.delete(key)
    redis.close()


@asynccontextmanager
async def running_ingest(
    worker_url: str, secret: str, folder: Path, name: str, *extra: str
) -> AsyncIterator[str]:
    """A ``framerelay ingest`` process on the sample clip (Redis on, results received);
    yields its base URL. ``extra``: more options (e.g. ``--latency-slo-ms 50``)."""
    port, prefix = free_port(), f"test-{name}-{os.getpid()}"
    env = {**BASE_ENV, "FRAMERELAY_TOKEN_SECRETS": secret,
           "FRAMERELAY_REDIS_URL": "redis://127.0.0.1:6379/0",
           "FRAMERELAY_INGEST_RESULTS__REDIS_PREFIX": prefix}  # fmt: skip
    log = folder / "ingest.log"
    proc = _spawn(
        ["ingest", "--worker-url", worker_url, "--worker-id", "test-worker", "--source",
         str(CLIP), "--fps", "5", "--realtime", "--loop", *extra, "--api-port", str(port)],
        env, log,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{base}/readyz", "the ingest", log)
        await _receive_results(base, secret)
        yield base
    finally:
        _end(proc)
        _drop_keys(prefix)


@pytest.fixture(scope="module")
async def ingest(
    local_worker: LocalWorker, secret: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    folder = tmp_path_factory.mktemp("ingest")
    async with running_ingest(local_worker.url, secret, folder, "promtool") as base:
        async with httpx.AsyncClient() as http:
            await http.get(f"{base}/v1/streams")  # one refusal: auth_refused has a sample
        yield base


async def _receive_results(base: str, secret: str, count: int = 2) -> None:
    """Subscribe and take ``count`` results: the hub's delivery histogram has samples."""
    url = base.replace("http://", "ws://") + "/v1/results?stream=stream-1"
    token = mint(secret, ["results:stream-1"], "ingest")
    async with connect(
        url, proxy=None, additional_headers={"Authorization": f"Bearer {token}"}
    ) as ws:
        seen = 0
        while seen < count:
            message = json.loads(await asyncio.wait_for(ws.recv(), 30 * TIMEOUT_FACTOR))
            seen += message["type"] == "result"


@pytest.fixture(scope="module")
def orchestrator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("orch")
    keys_file = tmp / "signing.jwks"
    keys_file.write_text(ed_keys().to_json())
    keys_file.chmod(0o600)
    port, prefix = free_port(), f"test-promtool-orch-{os.getpid()}:"
    env = {
        **BASE_ENV, "FRAMERELAY_SIGNING_KEYS_FILE": str(keys_file),
        "FRAMERELAY_ORCH_KEY_PREFIX": prefix, "FRAMERELAY_ORCH_CA_DIR": str(tmp / "ca"),
        "FRAMERELAY_ORCH_TIERS": json.dumps([{"name": "ondemand", "max_workers": 0}]),
        "FRAMERELAY_ORCH_TICK_S": "0.2",
    }  # fmt: skip
    proc = _spawn(["orchestrator", "--port", str(port)], env, tmp / "orchestrator.log")
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{base}/healthz", "the orchestrator", tmp / "orchestrator.log")
        httpx.get(f"{base}/v1/fleet")  # one refusal: auth_refused has a sample
        yield base
    finally:
        _end(proc)
        _drop_keys(prefix)


def _check(text: str, *expected: str) -> None:
    rc, out = promtool(text)
    assert (rc, out) == (0, ""), out
    for name in expected:
        assert samples(text, name), f"{name} missing"
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert not [n for n in names if any(old in n for old in RENAMED)], names


def test_worker_metrics_pass_promtool(local_worker: LocalWorker, ingest: str) -> None:
    url = local_worker.url.replace("ws://", "http://").removesuffix("/v1/tunnel") + "/metrics"
    text = httpx.get(url).text
    _check(text, "framerelay_worker_frames_total", "framerelay_worker_stage_seconds_bucket",
           "framerelay_worker_tunnels_total")  # fmt: skip


def test_ingest_hub_and_redis_metrics_pass_promtool(ingest: str) -> None:
    text = httpx.get(f"{ingest}/metrics").text
    i = "framerelay_ingest_"
    _check(
        text, i + "stream_frames_total", i + "stream_frames_dropped_total",
        i + "stream_frames_decoded_total", i + "stream_source_failures_total",
        i + "auth_refused_total", "framerelay_hub_delivery_delay_seconds_bucket",
        "framerelay_hub_results_sent_total", "framerelay_redis_stored_total", "framerelay_redis_up",
    )  # fmt: skip


def test_ingest_frame_outcomes_are_disjoint(ingest: str) -> None:
    """``sum()`` over the outcome never double-counts: result + dropped <= decoded, and the
    drop reasons add up to the dropped outcome (one scrape, one snapshot per stream)."""
    text = httpx.get(f"{ingest}/metrics").text
    outcome = samples(text, "framerelay_ingest_stream_frames_total")
    assert set(outcome) == {'{outcome="result",stream="stream-1"}',
                            '{outcome="dropped",stream="stream-1"}'}  # fmt: skip
    decoded = samples(text, "framerelay_ingest_stream_frames_decoded_total")
    assert sum(outcome.values()) <= decoded['{stream="stream-1"}']
    reasons = samples(text, "framerelay_ingest_stream_frames_dropped_total")
    assert sum(reasons.values()) == outcome['{outcome="dropped",stream="stream-1"}']
    assert outcome['{outcome="result",stream="stream-1"}'] > 0


def test_orchestrator_metrics_pass_promtool(orchestrator: str) -> None:
    text = httpx.get(f"{orchestrator}/metrics").text
    _check(
        text, "framerelay_orch_auth_refused_total", "framerelay_orch_fleet_cost_usd_total",
        "framerelay_orch_stream_seconds_total", "framerelay_orch_burn_rate_usd_per_hour",
    )  # fmt: skip
    assert "# TYPE framerelay_orch_events_total counter" in text


def test_promtool_flags_what_was_renamed() -> None:
    """The check is not vacuous: the old names fail it."""
    old = ("# HELP framerelay_worker_stage_ms Per-stage latency in ms\n"
           "# TYPE framerelay_worker_stage_ms gauge\nframerelay_worker_stage_ms 1.0\n"
           "# HELP framerelay_orch_stream_hours_total Stream-hours served\n"
           "# TYPE framerelay_orch_stream_hours_total counter\n"
           "framerelay_orch_stream_hours_total 1.0\n")  # fmt: skip
    rc, out = promtool(old)
    assert rc != 0 and "abbreviated units" in out and 'base unit "seconds"' in out
