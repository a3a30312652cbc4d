"""The recording worker: segments from the camera, sidecars from the durable results.

One thread remuxes the camera into segments (:mod:`ingest.recording.segmenter`);
the event loop reads the stream's durable results through a Redis consumer
group, places each on its frame (:mod:`ingest.recording.matcher`), appends it
to that segment's sidecar and acknowledges it only once written. A result whose
frame may still come waits (bounded); one whose time was not recorded goes to
a gap file. So after a crash nothing is lost (unacknowledged results come
again) and nothing is written twice (ids are checked). Each line carries the
result's durable id, the Redis entry id, which is the id the WebSocket API
gave it (one id everywhere); stored results with fields this recorder does not
know are recorded with those fields left out. On start it settles
what a crash left: the segment being written becomes ``partial`` and results
placed on frames that did not reach the disk move to a gap file.

A local file (not looping) is recorded once: when it has ended, the recorder
goes on placing results until none has come, and no frame either, for
``match_window_s``, then stops by itself (:attr:`Recorder.source_ended`).
"""

from __future__ import annotations

import asyncio
import calendar
import collections
import logging
import threading
import time

from redis.exceptions import RedisError

from framerelay.results import ResultId, ResultRecord
from framerelay.schemas import SidecarLine
from ingest.recording.index import SegmentIndex, SegmentInfo, probe_pts
from ingest.recording.matcher import FrameLog, Placement
from ingest.recording.segmenter import Event, FrameEvent, Segmenter
from ingest.recording.settings import RecorderSettings
from ingest.recording.sidecar import GAP_DIR, SidecarStore, gap_file
from ingest.redis_bus import RedisKeys, connect
from ingest.redis_consumer import Entry, ResultConsumer

log = logging.getLogger(__name__)
HOUSEKEEPING_S = 10.0
JOIN_TIMEOUT_S = 15.0
Waiting = tuple[ResultId, ResultRecord]
"""A result waiting for its frame."""


class Recorder:
    def __init__(self, settings: RecorderSettings) -> None:
        self.settings = settings
        self.directory = settings.out_dir / settings.stream_id
        self.index = SegmentIndex.load(self.directory, settings.stream_id)
        self.frames = FrameLog(window_s=settings.match_window_s)
        self.sidecars = SidecarStore(self.directory)
        self.pending: collections.deque[Waiting] = collections.deque()
        self.counts: collections.Counter[str] = collections.Counter()
        self._acks: list[ResultId] = []
        self._lock = threading.Lock()  # the index is touched by the segment thread too
        self._next_housekeeping = 0.0
        self._last_activity = time.monotonic()
        self.source_ended = False
        self.source_error: str | None = None

    def _take_epoch(self) -> int:
        with self._lock:
            return self.index.take_epoch()

    def _upsert(self, info: SegmentInfo) -> None:
        with self._lock:
            self.index.upsert(info)

    def recover(self) -> None:
        """Settle a crash: partial segments, torn sidecar lines, frames already on disk."""
        for seg, pts in self.index.recover():
            moved = self.sidecars.move_to_gaps(seg.sidecar, set(pts))
            log.warning("segment %s was cut short by a crash: %d frame(s) kept, %d result(s) "
                        "moved to gap files", seg.name, len(pts), moved)  # fmt: skip
        self.counts["recovered_ids"] = self.sidecars.recover()
        horizon = time.time() - self.frames.horizon_s
        for seg in self.index.segments:
            if seg.end_wall >= horizon:
                self.frames.open_epoch(seg.epoch, seg.tb, seg.wrap_bits)
                rel = probe_pts(self.directory / seg.name)
                self.frames.add_recorded(seg.epoch, seg.start_pts, seg.start_wall, rel, seg.name)

    async def run(self, stop: asyncio.Event) -> None:
        """Record until ``stop``; then place what is still pending and acknowledge it."""
        self.recover()
        client = connect(self.settings.redis_url.get_secret_value())
        key = RedisKeys(self.settings.redis_prefix).stream(self.settings.stream_id)
        consumer = ResultConsumer(
            client, key, self.settings.group, self.settings.consumer_name,
            claim_idle_ms=int(self.settings.claim_idle_s * 1000), block_ms=500,
        )  # fmt: skip
        loop = asyncio.get_running_loop()

        def sink(ev: Event) -> None:  # called in the segment thread
            loop.call_soon_threadsafe(self._on_event, ev)

        segmenter = Segmenter(self.settings, self.directory, sink, self._take_epoch)
        halt = threading.Event()
        thread = threading.Thread(target=segmenter.run, args=(halt,), name="segmenter", daemon=True)
        thread.start()
        try:
            await self._ensure_group(consumer, stop)
            while not stop.is_set() and not self._finished(segmenter, thread):
                self._handle(await consumer.read())
                await self._step(consumer)
        finally:
            halt.set()
            await asyncio.to_thread(thread.join, JOIN_TIMEOUT_S)
            await asyncio.sleep(0.05)  # let the last segment events land
            self._retry_pending(final=True)
            await self._commit(consumer)
            self.sidecars.close()
            await client.aclose()
            self.counts.update({f"redis_{k}": v for k, v in consumer.counts.items()})

    def _finished(self, segmenter: Segmenter, thread: threading.Thread) -> bool:
        """The file was recorded to its end and results stopped coming: time to stop."""
        if thread.is_alive() or not segmenter.ended:
            return False
        self.source_ended, self.source_error = True, segmenter.last_error
        if segmenter.connects == 0:
            return True  # it never opened: nothing to wait for
        return time.monotonic() - self._last_activity >= self.settings.match_window_s

    async def _ensure_group(self, consumer: ResultConsumer, stop: asyncio.Event) -> None:
        delay = 0.2
        while not stop.is_set():
            try:
                await consumer.ensure_group()
                return
            except (RedisError, OSError) as exc:
                log.warning("Redis not reachable yet (%s); retrying", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _step(self, consumer: ResultConsumer) -> None:
        self._retry_pending()
        await self._commit(consumer)
        now = time.monotonic()
        if now >= self._next_housekeeping:
            self._next_housekeeping = now + HOUSEKEEPING_S
            self.housekeeping()

    def _on_event(self, ev: Event) -> None:
        self._last_activity = time.monotonic()
        if isinstance(ev, FrameEvent):
            self.frames.add(ev)
            return
        info = ev.info
        self.frames.open_epoch(info.epoch, info.tb, info.wrap_bits)
        self._upsert(info)
        if ev.closed:
            self.counts["segments"] += 1
            self.sidecars.close(info.sidecar)

    def _handle(self, entries: list[Entry]) -> None:
        now = time.time()
        if entries:
            self._last_activity = time.monotonic()
        for entry in entries:
            if entry.record is None:
                self.counts["unreadable"] += 1
                self._acks.append(entry.id)
                continue
            placement = self.frames.place(entry.record, now)
            if placement is None:
                self.pending.append((entry.id, entry.record))
                if len(self.pending) > self.settings.pending_max:
                    self._retry_pending(force_one=True)
            else:
                self._write(entry.id, entry.record, placement)

    def _retry_pending(self, *, final: bool = False, force_one: bool = False) -> None:
        now = time.time()
        waiting: collections.deque[Waiting] = collections.deque()
        while self.pending:
            rid, record = self.pending.popleft()
            force = final or (force_one and not waiting)
            placement = self.frames.place(record, now, final=force)
            if placement is None:
                waiting.append((rid, record))
            else:
                self._write(rid, record, placement)
        self.pending = waiting

    def _write(self, rid: ResultId, record: ResultRecord, placement: Placement) -> None:
        line = SidecarLine(id=rid, segment=placement.segment, pts=placement.seg_pts,
                           time_base=placement.time_base, exact=placement.exact,
                           result=record)  # fmt: skip
        if placement.segment is None:
            name = gap_file(record.captured_at)
            self.counts["gap"] += 1
        else:
            name = placement.segment.rsplit(".", 1)[0] + ".jsonl"
            self.counts["exact" if placement.exact else "nearest"] += 1
        if not self.sidecars.write(name, line):
            self.counts["duplicate"] += 1
        self._acks.append(rid)

    async def _commit(self, consumer: ResultConsumer) -> None:
        """Written lines reach the OS, then their results are acknowledged."""
        if not self._acks:
            return
        self.sidecars.flush()
        await consumer.ack(self._acks)
        self._acks = []

    def housekeeping(self, now: float | None = None) -> None:
        t = time.time() if now is None else now
        self.frames.prune(t)
        with self._lock:
            removed = self.index.apply_retention(self.settings.retention_s,
                                                 self.settings.max_bytes, t)  # fmt: skip
        for seg in removed:
            self.sidecars.close(seg.sidecar)
        for path in (self.directory / GAP_DIR).glob("*.jsonl"):
            hour = calendar.timegm(time.strptime(path.stem, "%Y%m%dT%H"))
            if hour + 3600 < t - self.settings.retention_s:
                self.sidecars.close(f"{GAP_DIR}/{path.name}")
                path.unlink(missing_ok=True)

    def describe(self) -> dict[str, object]:
        return {
            "segments": len(self.index.segments),
            "pending": len(self.pending),
            **dict(self.counts),
            "sidecar_lines": self.sidecars.written,
            "source_ended": self.source_ended,
        }
