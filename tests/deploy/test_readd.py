"""A stream removed and re-added on the orchestrator between two reconcile passes runs the
new definition on the ingest (it used to keep the old one: the pass saw the same stream id
on the same worker and told the ingest nothing).

Real orchestrator (real Redis, local provider with a real worker process) and a
real ingest behind its HTTP API (tests/support/fleet.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from deploy.models import StreamSpec
from deploy.settings import TierConfig
from tests.conftest import CAMPUS, CLIP
from tests.support.fleet import running_fleet, settings_for
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.integration
OTHER = CAMPUS / "TUD-Campus.mp4"


async def test_remove_and_readd_within_one_tick_restarts_the_ingest_on_the_new_definition(
    secret: str, tmp_path: Path
) -> None:
    tier = TierConfig(name="ondemand", min_warm=1, max_workers=1, capacity_fps=12)
    settings = settings_for(secret, tmp_path / "ca", tiers=[tier], tick_s=1.0)

    async with running_fleet(settings) as fleet:
        store, pool = fleet.orch.store, fleet.pool
        await store.put_stream(StreamSpec(id="cam", url=str(CLIP), fps=4, loop=True))
        await wait_until_async(lambda: fleet.results_for("cam"), 120, "first results")
        assert pool.streams["cam"].config.url == str(CLIP)
        old = pool.streams["cam"]
        # both changes land between two passes (1 s apart; these take milliseconds)
        assert await store.del_stream("cam")
        await store.put_stream(StreamSpec(id="cam", url=str(OTHER), fps=2, loop=True))
        t0 = time.monotonic()
        await wait_until_async(
            lambda: pool.streams.get("cam") not in (None, old),
            10,
            "the ingest to restart the stream",
        )
        took = time.monotonic() - t0
        new = pool.streams["cam"]
        assert (new.config.url, new.config.fps) == (str(OTHER), 2)
        n = len(fleet.results_for("cam"))
        await wait_until_async(lambda: len(fleet.results_for("cam")) > n + 3, 60, "new results")
        assert not old.alive
        kinds = [str(e["kind"]) for e in fleet.orch.fleet.events]

    print(f"\nthe ingest ran the new definition {took:.2f} s after the re-add")
    assert "redefined" in kinds
