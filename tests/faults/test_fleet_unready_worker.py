"""Issue 11: a worker whose inference stalls (here: hangs, with a 2 s watchdog
deadline) says so on ``/readyz`` (503, with the reason) while ``/healthz`` still
answers. The orchestrator's heartbeat reads ``/readyz`` every pass, so it takes the
worker's streams away on the first pass that sees the 503 (no canary needed: here
the canary runs only once, to make the worker ready), reports the worker's own
reason, and replaces it; the streams' results resume on the new worker."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import cast

import httpx
import pytest

from deploy.models import PodSpec, StreamSpec
from deploy.settings import TierConfig
from tests.conftest import CLIP, TIMEOUT_FACTOR
from tests.support.fleet import running_fleet, settings_for
from tests.support.waiting import wait_until_async

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAULT = {"FRAMERELAY_WORKER_TEST_FAULT": "hang_inference_after:6",
         "FRAMERELAY_WORKER_TEST_HOOKS": "true",
         "FRAMERELAY_WORKER_INFERENCE_STALL_S": "2"}  # fmt: skip
FIRST, SECOND = "fr-ondemand-0-g0", "fr-ondemand-0-g1"
TICK_S = 0.5


def _fault_first_generation(spec: PodSpec) -> dict[str, str]:
    return dict(FAULT) if spec.name.endswith("-g0") else {}


async def _first_503(http_url: str, timeout_s: float) -> tuple[float, str]:
    """When (Unix time) the worker's /readyz first answered 503, and its body."""
    deadline = time.monotonic() + timeout_s * TIMEOUT_FACTOR
    async with httpx.AsyncClient(timeout=2) as http:
        while time.monotonic() < deadline:
            try:
                resp = await http.get(f"{http_url}/readyz")
                if resp.status_code == 503:
                    return time.time(), resp.text.strip()
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.05)
    raise TimeoutError("the worker's /readyz never answered 503")


async def test_a_worker_failing_readyz_loses_its_streams_at_once_and_is_replaced(
    secret: str, tmp_path: Path
) -> None:
    tier = TierConfig(name="ondemand", min_warm=1, max_workers=1, capacity_fps=12)
    settings = settings_for(secret, tmp_path / "ca", tiers=[tier], tick_s=TICK_S,
                            canary_interval_s=3600, unhealthy_after=2)  # fmt: skip

    async with running_fleet(settings, env_hook=_fault_first_generation) as fleet:
        await fleet.orch.store.put_stream(StreamSpec(id="cam", url=str(CLIP), fps=4, loop=True))
        await wait_until_async(lambda: fleet.results_for("cam"), 90, "first results")
        pod = (await fleet.orch.store.pods())[FIRST]
        assert pod.http_url is not None
        t_503, body = await _first_503(pod.http_url, 60)
        await wait_until_async(lambda: fleet.orch.fleet.counters["unhealthy"] >= 1, 10, "unready")
        event = next(e for e in fleet.orch.fleet.events if e["kind"] == "unhealthy")
        lag = cast(float, event["t"]) - t_503  # the fleet's clock is the system's
        await wait_until_async(
            lambda: any(r.worker_id == SECOND for r in fleet.results_for("cam")),
            90,
            "results from the replacement",
        )
        kinds = [(e["kind"], e["pod"]) for e in fleet.orch.fleet.events]
    print(f"\n/readyz 503 ({body!r}); orchestrator marked {FIRST} unhealthy {lag:.2f} s later "
          f"with {event['error']!r}; replaced by {SECOND}")  # fmt: skip
    assert event["pod"] == FIRST and event["healthz_ok"] is True and event["readyz_ok"] is False
    assert "not ready" in str(event["error"]) and body[:40] in str(event["error"])
    assert lag < (2 * TICK_S + 2) * TIMEOUT_FACTOR  # one pass (plus its probe), not a canary
    assert ("replaced", FIRST) in kinds and ("ready", SECOND) in kinds
