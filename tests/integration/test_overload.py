"""Acceptance: latency is bounded, never queued.

The worker's capacity is measured first (one file read as fast as possible,
every frame). One stream alone, real-time paced at no more than half that
capacity (every frame of the 25 fps clip where the worker serves 50 frames/s,
else sampled: a busy machine's worker served 14.5 frames/s under two CPU
hogs, so the clip alone overloaded it and half its frames were replaced),
gives the unloaded figures. Then enough 25 fps streams to offer about 4x the
capacity share the worker for three windows of 12 s (36 s;
``FRAMERELAY_OVERLOAD_WINDOW_S``, bench/overload.py uses 20 s).

What a queue would do, and what is asserted here, in frames rather than
milliseconds so that the machine's speed cancels out: the frames in the system
(results/s x mean latency, Little's law) and the median latency counted in the
worker's own time per result stay within 1.5x from the first window to the
last; the ingest's frames outstanding (sampled every 10 ms) do not grow from the
first window to the last beyond one per stream (the credit window does not
grow while the worker is the bottleneck); the excess shows up as counted
drops, and under capacity drops are rare next to those of the overload in the
same run. A queue leaking even one frame a second would add about 24 frames in
flight over the 24 s between the windows' starts, against about 10: 3.4x. The
margin was 1.2x while the p99 bound below was asserted too; 1.5x leaves room
for the worker's speed drifting within one window on a shared machine (its
rate and the window's latency are not measured over the same results).

The milliseconds are figures, printed here and measured by
``bench/overload.py`` over repeated pinned runs: the p99 of each window
against 1.5 x streams x unloaded p99 and the p99 ratio last/first. On these
shared 2-core VMs the worker's own speed drifts by up to a third within a
minute (42 then 31 results/s, infer p50 22 then 25 ms, in one standalone run),
and a 12 s p99 is set by a single VM stall. The report also shows the ingest's
longest event-loop stall and GC pause per window: a CI run failed the p99 bound
(308 ms against 231) with frames in flight unchanged; the rig then showed
100-190 ms full collections in the ingest, walking the result history held as
objects. The history is now kept as text and services freeze their start-up
heap (2 ms, 7 ms stalls since).

Ingest and worker share this machine's two cores, and a 1-thread worker runs
35-110 fps depending on the CPU, so 4x can take up to 18 streams of 25 fps;
the suite uses at most 8 (at least 1.5x offered). To run the 4x check:

    FRAMERELAY_OVERLOAD_MAX_STREAMS=18 pytest -s tests/integration/test_overload.py

which also pins the worker to the last core and the ingest (this process) to
the others, as across clouds they never share cores, and requires at least 3x.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from bench.rig.overload import Overload, measure
from framerelay.launcher import LocalWorker
from tests.conftest import MODEL, TIMEOUT_FACTOR

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("overload")]
"""One xdist group: the measurement (a module fixture that saturates the worker for about
a minute) is made once, not once per test on each xdist worker."""
OVERLOAD = 4.0
MAX_STREAMS = int(os.environ.get("FRAMERELAY_OVERLOAD_MAX_STREAMS", "8"))
PIN = MAX_STREAMS > 8
MIN_OVERLOAD = 3.0 if PIN else 1.5
WINDOW_S = float(os.environ.get("FRAMERELAY_OVERLOAD_WINDOW_S", "12"))
GROWTH = 1.5
"""Most growth of frames in the system from the first window to the last (a queue: 3.4x)."""
UNDER_CAPACITY_SHARE = 0.25
"""Under capacity, at most this fraction of the share of frames the overload replaced."""


@pytest.fixture(scope="module")
def one_thread_worker(secret: str) -> Iterator[LocalWorker]:
    """Ingest and worker share this machine's cores here (across clouds they do not):
    one inference thread keeps the worker's speed from depending on how many
    streams the ingest decodes next to it."""
    worker = LocalWorker(
        secret, worker_id="test-worker", args=["--model", str(MODEL), "--threads", "1"]
    )
    worker.start(timeout_s=120 * TIMEOUT_FACTOR)
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def run(one_thread_worker: LocalWorker, secret: str) -> Overload:
    proc = one_thread_worker.proc
    assert proc is not None
    return measure(
        one_thread_worker.url, secret, proc.pid,
        overload=OVERLOAD, max_streams=MAX_STREAMS, pin=PIN, window_s=WINDOW_S,
    )  # fmt: skip


def test_latency_does_not_grow_under_overload(run: Overload) -> None:
    print("\n" + run.report())  # in the call phase, so `pytest -rP` shows it too
    first, last = run.first, run.last
    assert last.in_flight <= GROWTH * first.in_flight, run.report()
    assert last.p50_frames <= GROWTH * first.p50_frames, run.report()
    assert last.outstanding_max <= max(first.outstanding_max, run.streams), run.report()
    assert run.offered_fps / run.served_fps >= MIN_OVERLOAD, run.report()


def test_excess_is_counted_drops_not_a_queue(run: Overload) -> None:
    for sid, c in run.loaded.counts.items():
        assert c["replaced"] > 0, sid
        # every sent frame was answered; nothing was lost in flight
        assert c["sent"] == c["results"], (sid, c)
        assert c["disconnected"] == c["timeout"] == c["worker_error"] == 0, (sid, c)
        # every decoded frame is accounted for: sent, replaced, dropped before the tunnel was up
        # (no_credit: decoding starts before the worker connects), or (at most one) in the slot
        assert 0 <= c["decoded"] - c["sent"] - c["replaced"] - c["no_credit"] <= 1, (sid, c)


def test_under_capacity_nothing_is_dropped(run: Overload) -> None:
    (c,) = run.alone.counts.values()
    assert c["sent"] == c["results"], c  # nothing lost in flight
    # one credit: a frame is replaced whenever one round trip (or a stall of the ingest's
    # event loop) takes longer than a frame interval, here at least two of the worker's
    # times per frame; on an idle shared 2-core box 1-2.3 % of frames see such a hiccup
    # inside the full suite. Judged against the same run's overload, which replaces at
    # least a third of the frames (1.5x offered) and about three quarters at 4x.
    assert run.alone_replaced <= UNDER_CAPACITY_SHARE * run.loaded_replaced, run.report()
