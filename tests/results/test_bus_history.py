"""The bus history: exact replays, and nothing for the garbage collector to walk.

A full collection stops the ingest's event loop for as long as it walks the
tracked objects; held as records, 8 streams x 1024 results were ~200k of them
(100-300 ms pauses on a 2-core VM, measured in the overload test's ingest).
"""

from __future__ import annotations

import gc

from bench.rig.records import result_record as record
from ingest.bus import IdAllocator, ResultBus


def test_history_replays_the_published_records_exactly() -> None:
    bus = ResultBus(history=4)
    published = [bus.push(record("cam-1", i)) for i in range(6)]
    held = bus.history("cam-1")
    assert [p.id for p in held] == [p.id for p in published[2:]]
    assert [p.record for p in held] == [p.record for p in published[2:]]
    assert all(p.record.id == p.id for p in held)
    assert [p.id for p in bus.history("cam-1", after=published[4].id)] == [published[5].id]
    assert bus.oldest("cam-1") == published[2].id
    assert bus.history("cam-2") == [] and bus.oldest("cam-2") is None


def test_a_full_history_adds_nothing_for_the_collector_to_walk() -> None:
    streams, history = 8, 1024
    bus = ResultBus(history=history)
    gc.collect()
    before = len(gc.get_objects())
    for seq in range(history + 10):
        for s in range(streams):
            bus.push(record(f"cam-{s}", seq))
    gc.collect()  # strings and tuples of untracked items are untracked by a collection
    added = len(gc.get_objects()) - before
    held = sum(len(bus.history(f"cam-{s}")) for s in range(streams))
    assert held == streams * history
    # the deques, their dict, first-use caches: 164 measured; held as records (before),
    # the same history added 155,657 tracked objects (19 per result)
    assert added < 1000, f"{added} tracked objects for {held} held results"


def test_history_holds_no_result_older_than_its_age_limit() -> None:
    """A slow stream's history stops growing after ``history_s``, not after 1024 results."""
    now = [1_800_000_000.0]
    bus = ResultBus(history=1024, history_s=60.0, ids=IdAllocator(clock=lambda: now[0]))
    for _ in range(300):  # 10 minutes of a 0.5 fps stream
        bus.push(record("cam-1", 0))
        now[0] += 2.0
    held = bus.history("cam-1")
    assert len(held) == 31  # the newest result and the 30 in the 60 s before it
    assert held[-1].id.ms - held[0].id.ms == 60_000


def test_an_age_limit_of_zero_keeps_the_count_limit_only() -> None:
    now = [1_800_000_000.0]
    bus = ResultBus(history=8, history_s=0.0, ids=IdAllocator(clock=lambda: now[0]))
    for _ in range(20):
        bus.push(record("cam-1", 0))
        now[0] += 3600.0
    assert len(bus.history("cam-1")) == 8
    bus.resize_history(8, max_age_s=1.0)
    bus.push(record("cam-1", 0))
    assert len(bus.history("cam-1")) == 1


def test_a_stream_that_stopped_publishing_is_forgotten_after_the_age_limit() -> None:
    """Streams come and go: a removed stream's history and id state do not stay forever."""
    now = [1_800_000_000.0]
    ids = IdAllocator(clock=lambda: now[0])
    bus = ResultBus(history=1024, history_s=60.0, ids=ids)
    for i in range(50):  # 50 streams, each publishing a little, then removed
        bus.push(record(f"gone-{i}", 0))
        now[0] += 1.0
    for _ in range(200):  # one stream keeps going for 200 s
        bus.push(record("cam-1", 0))
        now[0] += 1.0
    assert [s for s in bus._history if s.startswith("gone-")] == []
    assert [s for s in ids._last if s.startswith("gone-")] == []
    assert len(bus.history("cam-1")) == 61
    first = bus.push(record("gone-3", 0))  # a stream added again gets a newer id
    assert first.record.id is not None and first.record.id.ms > 1_800_000_000_000 + 49_000
