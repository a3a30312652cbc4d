"""Acceptance of issue 11: the fault matrix, against real services as processes.

One rig for the module (:mod:`bench.rig.matrix_harness`): two workers on CPU
with the real model, one ingest process with its API, two healthy streams (the
sample clip in real time, looped, 4 fps) on the first worker and a subscriber
of the results WebSocket. Each test injects one fault
(:mod:`bench.rig.matrix_faults`) and prints its figures. Judged for each, by
behaviour (whatever else the machine is doing):

* the healthy streams are isolated from the fault: every frame they sent meanwhile
  was answered (no frame lost in flight: disconnected, timeout, worker error), they
  stay RUNNING and are not starved (at least half their result rate of the seconds
  before the fault);
* the bad stream ends in a state with a clear reason;
* no process exits; every process's RSS comes back within 20 MB of its level
  before the fault (waited for up to 12 s).

Their p99 latency before and during the fault, and the share of their rate kept, are
printed, not judged: on a busy machine both move with the load, not with the fault.
The figures issue 11 set (>= 95 % of the rate, p99 within 2x) are judged by
``bench/fault_matrix.py``, the same scenarios on a machine to itself.

The 60 s freeze runs only with ``FRAMERELAY_FAULT_LONG_FREEZE=1`` or outside CI
(``CI`` unset); in CI the 10 s one covers the same path.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bench.rig import matrix_faults as faults
from bench.rig.matrix_harness import Rig, Scenario, run_scenario
from ingest.metrics import FLIGHT_DROPS
from tests.conftest import TIMEOUT_FACTOR

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("fault-matrix")]
CLIP_S = 7.0
"""Length of the sample clip (179 frames at 25 fps)."""
KEPT_MIN_PCT = 50.0
"""The garbage flood's healthy streams keep at least this share of their rate (else 95):
not starved (a starved stream keeps none)."""
KEPT_MIN_PCT = 50.0
"""The healthy streams keep at least this share of their result rate during a fault: not
starved (a starved stream keeps none). On a machine without spare CPU a 4 fps stream
replaces a frame at the sender whenever a round trip passes 250 ms."""
LONG_FREEZE = os.environ.get("FRAMERELAY_FAULT_LONG_FREEZE") == "1" or not os.environ.get("CI")


class Rigs:
    """The module's rig, started again when a scenario left a process dead or the healthy
    streams without results (so that each scenario is judged on its own)."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.rig: Rig | None = None

    def get(self) -> Rig:
        if self.rig is not None and not self._healthy(self.rig):
            self.close()
        if self.rig is None:
            root = self.factory.mktemp("matrix")
            faults.make_media(root)
            self.rig = Rig(root).start()
        return self.rig

    @staticmethod
    def _healthy(rig: Rig) -> bool:
        """Every process alive and every healthy stream's results flowing."""
        assert rig.subscriber is not None
        recent = {s.stream for s in rig.subscriber.snapshot() if s.received_at > time.time() - 5}
        return all(rig.alive().values()) and all(sid in recent for sid in rig.healthy_ids)

    def close(self) -> None:
        if self.rig is not None:
            self.rig.close()
            self.rig = None


@pytest.fixture(scope="module")
def rigs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rigs]:
    holder = Rigs(tmp_path_factory)
    try:
        yield holder
    finally:
        holder.close()


@pytest.fixture
def rig(rigs: Rigs) -> Rig:
    return rigs.get()


def _judged(
    rig: Rig, name: str, scenario: Scenario, setup: Callable[[Rig], None] | None = None
) -> dict[str, Any]:
    """Run one scenario; judge the healthy streams' isolation and the processes (module
    doc); the bad side's figures, for the test to judge."""
    before = {sid: rig.stream(sid) for sid in rig.healthy_ids}
    figures = run_scenario(
        rig, name, scenario, setup=setup, latency_factor=None, kept_min_pct=KEPT_MIN_PCT
    )
    print(figures.report())
    problems = figures.problems()
    for sid, was in before.items():
        now = rig.stream(sid)
        lost = {k: now[k] - was[k] for k in FLIGHT_DROPS if now[k] != was[k]}
        if now["state"] != "RUNNING" or lost:
            problems.append(f"{sid}: {now['state']}, frames lost in flight {lost}")
    assert not problems, "\n".join([*problems, rig.log_tail("ingest", 1500)])
    return figures.bad


def test_1x1_source_fails_alone(rig: Rig) -> None:
    bad = _judged(rig, "1x1 source", faults.tiny)["tiny-1x1"]
    assert bad["state"] == "FAILED" and bad["error"], bad


def test_8k_source_is_downscaled_or_refused(rig: Rig) -> None:
    bad = _judged(rig, "8K source", faults.huge)["huge-8k"]
    assert (bad["state"] == "FAILED" and bad["error"]) or (
        bad["state"] == "STOPPED" and bad["results"] > 0
    ), bad


def test_byte_flipped_file_stays_in_its_budgets(rig: Rig) -> None:
    bad = _judged(rig, "byte-flipped file", faults.flipped)["flipped"]
    assert bad["sent_per_s"] <= bad["fps"] * 1.1, bad
    assert bad["corrupt_timestamps"] > 0 and bad["error"], bad  # the storm is named
    budget = bad["max_epochs_per_min"] * math.ceil(bad["span_s"] / 60)
    loops = math.ceil(bad["span_s"] / CLIP_S) + 1  # each pass of the looped file is one
    assert bad["epoch"] <= budget + loops, bad


def test_camera_answering_401_is_an_auth_failure_retried_slowly(rig: Rig) -> None:
    bad = _judged(rig, "camera answering 401", faults.camera_401)
    for sid, cam in bad.items():
        assert cam["state"] == "AUTH_FAILED" and cam["error"], (sid, cam)
        assert cam["auth_failed"] >= 1, (sid, cam)
        assert cam["attempts"] <= 2, f"{sid}: {cam['attempts']} attempts in 8 s: not slow"


def test_non_finite_api_inputs_are_refused(rig: Rig) -> None:
    bad = _judged(rig, "NaN/Inf/huge in API fields", faults.api_values)
    api = bad["api"]
    assert not api["accepted_non_finite"], api
    assert not api["server_errors"], api


def test_non_finite_wire_fields_to_a_worker_are_refused(rig: Rig) -> None:
    bad = _judged(rig, "NaN/Inf/huge in wire fields", faults.wire_values)
    worker = bad["worker"]
    assert not worker["accepted_non_finite"], worker
    assert not worker["no_answer"] and not worker["garbled_answer"], worker
    assert worker["valid_after"] == "result", worker
    assert worker["readyz"].startswith("200"), worker


def test_non_finite_wire_fields_from_a_worker_hit_only_its_stream(rig: Rig) -> None:
    bad = _judged(rig, "NaN/Inf/huge from a fake worker", faults.ingest_wire_values)
    victim = bad["victim-fake"]
    assert victim["non_finite_published"] == 0, victim
    assert victim["disconnected"] + victim["worker_error"] + victim["reconnects"] > 0, victim


def test_garbage_flooding_tunnel_leaves_other_streams_alone(rig: Rig) -> None:
    """The healthy streams are isolated (module doc) and the flooder's tunnels closed.

    The flooder runs in this process beside the ingest and the worker: on a machine
    without spare CPU what it costs them shows as latency and as frames the ingest
    replaces at the sender, not as anything the worker refuses or loses. Under two CPU
    hogs: p99 193 -> 293 ms (CI), 240 -> 621 ms with 87 % kept, 131 -> 1121 ms with 74 %
    kept, each time with the worker serving at most 2 frames ahead of a healthy one
    (printed), i.e. in turn: the time went to the shared CPU, not to a queue behind the
    flooder."""
    bad = _judged(rig, "garbage-flooding tunnel", faults.flood)
    assert bad["worker_readyz"] == 200, bad
    assert bad["flooder"].get("closed:1002", 0) > 0, bad


def _frozen(rig: Rig, seconds: float) -> dict[str, Any]:
    setup, scenario = faults.frozen_worker(seconds)
    bad = _judged(rig, f"worker frozen {seconds:.0f} s", scenario, setup)
    (victim,) = bad.values()
    # STALLED within 3 s (the history says when, as a failover may follow at once) ...
    assert victim["stalled_after_s"] is not None, victim
    assert victim["stalled_after_s"] <= 3 * TIMEOUT_FACTOR, victim
    assert victim["stalled_reason"], victim
    # ... then either moved to the other worker (the default one counts since the single
    # registry) or shown STALLED until the worker answers again
    moved = [
        r
        for t, state, r in victim["changes"]
        if state == "RUNNING" and t >= victim["stalled_after_s"] and "fm-b" not in r
    ]
    assert moved or victim["frozen_state"] == "STALLED", victim
    assert victim["results_again_after_s"] is not None, victim
    return dict(victim)


def test_worker_frozen_10_s(rig: Rig) -> None:
    _frozen(rig, 10)


@pytest.mark.skipif(not LONG_FREEZE, reason="60 s freeze: set FRAMERELAY_FAULT_LONG_FREEZE=1")
def test_worker_frozen_60_s(rig: Rig) -> None:
    _frozen(rig, 60)


def test_worker_whose_inference_raises(rig: Rig) -> None:
    setup, scenario = faults.raising_worker()
    bad = _judged(rig, "inference loop raises", scenario, setup)
    victim = bad["victim-raise"]
    assert victim["error"] and "inference" in victim["error"], victim  # the reason, named
    assert victim["noticed_after_s"] is not None, victim
    assert victim["worker_alive"], victim
