"""Acceptance: latency is bounded, never queued.

The worker's capacity is measured first (one file read as fast as possible,
every frame). One stream alone (real-time paced, every frame) gives the
unloaded p99. Then enough such streams (each at the clip's 25 fps) to offer
about 4x the capacity share the worker for three windows of 12 s (36 s;
``FRAMERELAY_OVERLOAD_WINDOW_S``, bench/overload.py uses 20 s).

What a queue would do, and what is asserted here: the frames in the system
(results/s x mean latency, Little's law) and the median latency counted in the
worker's own time per result stay within 1.2x from the first window to the
last; p99 stays below 1.5 x streams x unloaded p99 in both windows; the excess
shows up as counted drops; and the ingest never has more than one frame per
stream outstanding in the last window (sampled every 10 ms: the credit window
does not grow while the worker is the bottleneck). A queue leaking even one
frame a second would add about 24 frames in flight over the 24 s between the
windows' starts, against about 10.

The report also shows the ingest's longest event-loop stall and GC pause per
window: a CI run failed the p99 bound (308 ms against 231) with frames in
flight unchanged; the rig then showed 100-190 ms full collections in the
ingest, walking the result history held as objects. The history is now kept
as text and services freeze their start-up heap (2 ms, 7 ms stalls since).

The p99 ratios (raw, and in the worker's time) are printed but not asserted:
on these shared 2-core VMs the worker's own speed drifts by up to a third
within a minute (42 then 31 results/s, infer p50 22 then 25 ms, in one
standalone run), and a 20 s p99 is the ~18th-worst of ~1800 results, set by a
single VM stall. One run here measured p99 in frames 1.20x with frames in
flight 1.02x and the worker 10 % faster in the last window: no queue, a tail.
``bench/overload.py`` measures the raw ratio over repeated pinned runs, as
speed targets are.

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

pytestmark = [pytest.mark.integration, pytest.mark.slow]
OVERLOAD = 4.0
MAX_STREAMS = int(os.environ.get("FRAMERELAY_OVERLOAD_MAX_STREAMS", "8"))
PIN = MAX_STREAMS > 8
MIN_OVERLOAD = 3.0 if PIN else 1.5
WINDOW_S = float(os.environ.get("FRAMERELAY_OVERLOAD_WINDOW_S", "12"))


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
    assert last.in_flight <= 1.2 * first.in_flight, run.report()
    assert last.p50_frames <= 1.2 * first.p50_frames, run.report()
    assert max(first.p99_ms, last.p99_ms) < run.bound_ms, run.report()
    assert last.outstanding_max <= run.streams, run.report()
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
    assert c["sent"] == c["results"]
    # one credit: a frame is replaced whenever one round trip takes longer than a frame
    # interval (40 ms); on this shared 2-core box 1-2.3 % of frames see such a hiccup
    # inside the full suite (0 lost in flight: sent == results above)
    assert c["replaced"] <= c["decoded"] * 0.05, c
