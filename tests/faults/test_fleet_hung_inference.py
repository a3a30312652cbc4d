"""Acceptance 5: a worker whose /healthz answers but whose inference is hung
(FRAMERELAY_WORKER_TEST_FAULT, refused unless FRAMERELAY_WORKER_TEST_HOOKS=true:
no test hook in production) is caught by the canary and replaced."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.models import PodSpec, StreamSpec
from deploy.settings import TierConfig
from tests.conftest import CLIP
from tests.support.fleet import running_fleet, settings_for
from tests.support.waiting import wait_until_async

pytestmark = [pytest.mark.integration, pytest.mark.slow]


HANG = {"FRAMERELAY_WORKER_TEST_FAULT": "hang_inference_after:4",
        "FRAMERELAY_WORKER_TEST_HOOKS": "true"}  # fmt: skip


def _hang_first_generation(spec: PodSpec) -> dict[str, str]:
    return dict(HANG) if spec.name.endswith("-g0") else {}


async def test_hung_inference_is_detected_by_the_canary_and_replaced(
    secret: str, tmp_path: Path
) -> None:
    tier = TierConfig(name="ondemand", min_warm=1, max_workers=1, capacity_fps=12)
    settings = settings_for(
        secret, tmp_path / "ca", tiers=[tier], canary_timeout_s=3, canary_interval_s=1
    )

    async with running_fleet(settings, env_hook=_hang_first_generation) as fleet:
        await fleet.orch.store.put_stream(StreamSpec(id="cam", url=str(CLIP), fps=2, loop=True))
        hung = "fr-ondemand-0-g0"
        await wait_until_async(lambda: fleet.results_for("cam"), 90, "first results")
        await wait_until_async(
            lambda: fleet.orch.fleet.counters["unhealthy"] >= 1, 60, "canary catch"
        )
        unhealthy = [e for e in fleet.orch.fleet.events if e["kind"] == "unhealthy"]
        await wait_until_async(
            lambda: any(r.worker_id == "fr-ondemand-0-g1" for r in fleet.results_for("cam")),
            90,
            "results from the replacement",
        )
        events = list(fleet.orch.fleet.events)
        first = unhealthy[0]
        healthz, error = first.get("healthz_ok"), str(first.get("error"))
    kinds = [(e["kind"], e["pod"]) for e in events]
    assert healthz is True  # /healthz answered while inference was hung
    assert ("unhealthy", hung) in kinds and ("replaced", hung) in kinds
    assert error is not None and "canary" in str(error)
    assert ("ready", "fr-ondemand-0-g1") in kinds
    print(f"\nhung worker {hung}: {error}; replaced by fr-ondemand-0-g1")
