"""Acceptance 1: local provider, 3 workers, 6 streams; kill -9 one worker: its
streams are re-homed and results resume within 10 s, no stream is served by two
workers at once, and track ids continue (the snapshot travels)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from deploy.models import StreamSpec
from tests.conftest import CLIP, TIMEOUT_FACTOR
from tests.support.fleet import (
    SNAPSHOT_S,
    Fleet,
    resumed_sessions,
    running_fleet,
    settings_for,
)
from tests.support.waiting import wait_until_async

pytestmark = [pytest.mark.integration, pytest.mark.slow]
RESUME_LIMIT_S = 10.0
MAX_LOST_S = 1.0  # tracker default (tracker/settings.py)


def _never_back_and_forth(workers: list[str]) -> bool:
    runs = [w for i, w in enumerate(workers) if i == 0 or workers[i - 1] != w]
    return len(runs) == len(set(runs))


async def _scenario(fleet: Fleet) -> dict[str, object]:
    for i in range(6):
        spec = StreamSpec(id=f"cam-{i}", url=str(CLIP), fps=3, loop=True, priority="critical")
        await fleet.orch.store.put_stream(spec)
    ids = [f"cam-{i}" for i in range(6)]
    await wait_until_async(
        lambda: all(fleet.results_for(s) for s in ids), 120, "all 6 streams flowing"
    )
    assign = await fleet.orch.store.assignments()
    victim = max(set(assign.values()), key=lambda p: list(assign.values()).count(p))
    moved = sorted(s for s, p in assign.items() if p == victim)
    await asyncio.sleep(1.5)  # a snapshot or two
    killed_at = time.time()
    fleet.provider.kill(victim)

    def resumed() -> bool:
        return all(
            any(r.worker_id != victim and r.received_at > killed_at for r in fleet.results_for(s))
            for s in moved
        )

    await wait_until_async(resumed, 30, "results of the moved streams on another worker")
    gaps = {
        s: min(r.received_at for r in fleet.results_for(s) if r.received_at > killed_at) - killed_at
        for s in moved
    }
    await asyncio.sleep(2)
    new_assign = await fleet.orch.store.assignments()
    pods = await fleet.orch.store.pods()
    resumed_total = 0
    for name in {new_assign[s] for s in moved}:
        url = pods[name].http_url
        assert url is not None
        resumed_total += await resumed_sessions(url)
    await wait_until_async(lambda: len(fleet.provider.pods) >= 4, 60, "a replacement pod")
    return {"victim": victim, "moved": moved, "gaps": gaps, "resumed": resumed_total,
            "killed_at": killed_at}  # fmt: skip


async def test_kill_9_worker_rehomes_its_streams(secret: str, tmp_path: Path) -> None:
    async with running_fleet(settings_for(secret, tmp_path / "ca")) as fleet:
        out = await _scenario(fleet)
    gaps = out["gaps"]
    assert isinstance(gaps, dict) and len(gaps) >= 1
    print(f"\nkill -9 {out['victim']}: streams {out['moved']} resumed after "
          + ", ".join(f"{s}={g:.2f}s" for s, g in gaps.items()))  # fmt: skip
    assert max(gaps.values()) <= RESUME_LIMIT_S * TIMEOUT_FACTOR
    for i in range(6):
        workers = [r.worker_id for r in fleet.results_for(f"cam-{i}")]
        assert _never_back_and_forth(workers), (i, workers)
    assert out["resumed"] == len(gaps)  # every moved stream resumed from a snapshot
    killed_at = out["killed_at"]
    assert isinstance(killed_at, float)
    continued, eligible = 0, 0
    for s, gap in gaps.items():
        if gap + SNAPSHOT_S >= MAX_LOST_S:
            continue  # the tracker itself drops tracks unseen this long: new ids are right
        eligible += 1
        recs = fleet.results_for(s)
        last = [r for r in recs if r.received_at < killed_at][-5:]
        before = {d.tracker_id for r in last for d in r.detections if d.tracker_id > 0}
        after = {d.tracker_id for r in recs if r.received_at > killed_at for d in r.detections
                 if d.tracker_id > 0}  # fmt: skip
        continued += bool(before & after)
    print(f"track ids continued on {continued} of {eligible} streams re-homed within the "
          f"tracker's {MAX_LOST_S} s")  # fmt: skip
    assert eligible == 0 or continued >= 1, "no moved stream kept a track id"
