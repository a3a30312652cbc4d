"""Issue 13: every service's real ``/metrics`` passes ``promtool check metrics``.

Real processes: the session's worker, ``framerelay ingest`` on the sample clip
with Redis on (so the result hub and the Redis publisher expose their series
with values) and a subscriber that received results, and ``framerelay
orchestrator``. promtool (Debian's ``prometheus`` package, installed by
scripts/services.sh) must print nothing and exit 0: base units (seconds),
``_total`` counters, no abbreviated units.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from framerelay.launcher import LocalWorker
from tests.support.promtool import promtool
from tests.support.service_processes import running_ingest

# sync tests on an async fixture: anyio sets it up only where anyio_backend is requested
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("anyio_backend")]
RENAMED = ("_ms", "_ms_bucket", "stream_hours", "framerelay_orch_fleet_usd", "source_events")


def samples(text: str, name: str) -> dict[str, float]:
    """``{labels: value}`` of one metric's samples in an exposition text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            series, value = line.rsplit(" ", 1)
            out[series[len(name) :]] = float(value)
    return out


@pytest.fixture(scope="module")
async def ingest(
    local_worker: LocalWorker, secret: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    folder = tmp_path_factory.mktemp("ingest")
    async with running_ingest(local_worker.url, secret, folder, "promtool") as base:
        async with httpx.AsyncClient() as http:
            await http.get(f"{base}/v1/streams")  # one refusal: auth_refused has a sample
        yield base


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
