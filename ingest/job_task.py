"""How an ingest runs a batch job's task (issue 18): a stream whose config carries a
:class:`framerelay.jobs.JobTask`.

Such a stream reads its file once, losslessly, as fast as its worker answers (never
paced: :func:`ingest.settings.job_problem` refuses realtime, loop and live sources), and
analyses the frames :func:`ingest.job_ledger.sampled` picks at its ``fps`` (0: every
frame). Its :class:`JobRun`:

- **starts** at the task's checkpoint: ``GET <prefix>:job:<job>:<k>:checkpoint`` (a PTS;
  the progress's ``time_base`` turns it into a seek), after repairing the sidecar and
  reading back which frames it holds; frames below the checkpoint (the seek lands on a
  keyframe before it) or already in the sidecar are skipped, not sent;
- **writes** every result of the stream to the sidecar (:mod:`ingest.job_sidecar`) under
  the frame's own id, once; the result still goes to the bus (WebSocket, Redis, under the
  bus's ids) like any stream's;
- every :data:`PROGRESS_EVERY_S` flushes and fsyncs the sidecar, then sets the checkpoint
  (the PTS below which every sampled frame is in the sidecar) and the task's
  :class:`~framerelay.jobs.TaskProgress` (``<...>:progress``), in that order;
- when frames in flight are lost (their worker died, stalled, was replaced, or answered
  an error: the stream's ``disconnected``, ``timeout`` and ``worker_error`` counters),
  reads the input again from the checkpoint (:class:`ingest.job_ledger.Rewind`);
- at the end of the input, once every frame is answered and on disk, writes progress
  ``done`` and only then lets the stream end (``STOPPED``, "source ended"); a stream that
  fails (an unreadable input, a sidecar it cannot write) writes ``failed`` with its
  error; one stopped before its end (removed, moved away, the ingest stopping) writes
  ``pending``: it resumes from its checkpoint wherever it runs next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path

from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import RedisError

from framerelay.errors import ConfigError
from framerelay.jobs import JobTask, TaskProgress, TaskState, checkpoint_key, progress_key
from framerelay.results import ResultRecord
from framerelay.timeline import Timeline
from ingest.job_ledger import Figures, Rewind, TaskLedger, sampled
from ingest.job_sidecar import SidecarError, TaskSidecar, segment_name, sidecar_problem
from ingest.redis_bus import connect
from ingest.resume import ResumeAt
from ingest.settings import IngestSettings, StreamConfig
from ingest.stream import IngestStream, StreamState

log = logging.getLogger(__name__)
TICK_S = 0.25
"""How often a task looks for lost frames and for its stream's end."""
PROGRESS_EVERY_S = 0.5
"""Flush, checkpoint and progress at most this often (and at the end)."""
HEARTBEAT_S = 5.0
"""Progress is written at least this often while running (``updated_at``)."""
RETRY_S = 1.0
FINAL_TIMEOUT_S = 5.0
LOST = ("disconnected", "timeout", "worker_error")
"""The stream's counters of frames sent and never answered."""


class JobRun:
    """One task stream's job side: its ledger, its sidecar and its keeper (:meth:`keep`)."""

    def __init__(self, stream: IngestStream, task: JobTask, redis: Redis, prefix: str) -> None:
        self.stream = stream
        self.task = task
        self.ledger = TaskLedger()
        self.sidecar = TaskSidecar(Path(task.sidecar), task.index, segment_name(stream.config.url))
        self._redis = redis
        self._keys = (
            checkpoint_key(prefix, task.job_id, task.index),
            progress_key(prefix, task.job_id, task.index),
        )
        self._open = False
        """Results are written (the sidecar is open and not handed over)."""
        self._handed = False
        """A new definition of the stream runs the task now: this run writes nothing more."""
        self._time_base: Fraction | None = None
        self._lost_seen = 0
        self._written_at = self._flushed_at = -math.inf
        self._last: tuple[int | None, int] | None = None
        self.duplicates = 0
        """Results of a frame already in the sidecar (not written again)."""
        self.billed_s: float | None = None
        """Worker seconds a serverless endpoint billed this run (ingest.serverless_task)."""
        self._billed_before = 0.0

    # -- the decode thread (ingest.job_ledger.JobReader) ------------------------------

    def wants(self, pts: int, timeline: Timeline) -> bool:
        self._time_base = tb = timeline.time_base
        if pts < 0 or not sampled(pts, timeline.step, tb, self.stream.config.fps):
            return False
        return self.ledger.admit(pts)

    def offered(self, pts: int) -> None:
        self.ledger.offered(pts)

    def read(self, run_pass: Callable[[ResumeAt | None], None], stop: threading.Event) -> None:
        while not self.ledger.ready.wait(0.2):
            if stop.is_set():
                return
        while not stop.is_set():
            try:
                run_pass(self._resume_at())
                if stop.is_set():
                    return
                self.ledger.end_of_input()
                self.ledger.wait_end(stop)
                return
            except Rewind:
                log.info("job task %s: frames in flight were lost; reading again from PTS %s",
                         self.stream.id, self.ledger.floor)  # fmt: skip

    def _resume_at(self) -> ResumeAt | None:
        floor, tb = self.ledger.floor, self._time_base
        return None if floor is None or tb is None else ResumeAt(float(floor * tb))

    # -- the event loop ---------------------------------------------------------------

    def result(self, record: ResultRecord) -> None:
        """A result of the stream: into the sidecar, once per frame."""
        if not self._open or record.pts < 0:
            return
        if self.ledger.is_known(record.pts):
            self.duplicates += 1
            return
        try:
            self.sidecar.write(record)
        except (OSError, SidecarError) as exc:
            self._open = False
            self.stream.fail(f"job sidecar {self.task.sidecar}: cannot write: {exc}")
            return
        self.ledger.answered(record.pts)

    def hand_over(self) -> None:
        """A new definition of the stream takes the task over: flush, write no more (the
        sidecar, the checkpoint and the progress are the new run's)."""
        self._open = False
        self._handed = True
        with contextlib.suppress(OSError):
            self.sidecar.flush()

    async def keep(self) -> None:
        """Start the task, keep its checkpoint and progress, record how it ends."""
        try:
            if await self._start():
                await self._follow()
        except (SidecarError, OSError) as exc:
            reason = str(exc) if isinstance(exc, SidecarError) else f"job sidecar: {exc}"
            self.stream.fail(reason)
            await self._final("failed", reason)
        finally:
            self._open = False
            with contextlib.suppress(OSError):
                self.sidecar.close()

    async def _start(self) -> bool:
        """Read the checkpoint (retrying Redis), open the sidecar; False if the stream ended
        first."""
        while True:
            if self._ended() or self._handed:
                return False
            try:
                floor, tb = await self._read_checkpoint()
                break
            except (RedisError, OSError) as exc:
                log.warning("job task %s: cannot read its checkpoint (%s); retrying",
                            self.stream.id, type(exc).__name__)  # fmt: skip
                await asyncio.sleep(RETRY_S)
        known, lines = await asyncio.to_thread(self.sidecar.open)
        if self._handed:
            return False
        self._time_base = self._time_base or tb
        self.ledger.begin(floor, known, lines)
        self._open = True
        log.info("job task %s: starts at PTS %s, %d frames in its sidecar",
                 self.stream.id, floor, lines)  # fmt: skip
        await self._write("running", self.ledger.durable(frozenset()))
        return True

    async def _read_checkpoint(self) -> tuple[int | None, Fraction | None]:
        raw, progress = await self._redis.mget(list(self._keys))
        floor: int | None = None
        tb: Fraction | None = None
        try:
            floor = int(raw) if raw is not None else None
            seen = TaskProgress.model_validate_json(progress) if progress is not None else None
            tb = Fraction(*seen.time_base) if seen is not None and seen.time_base else None
            self._billed_before = seen.execution_s or 0.0 if seen is not None else 0.0
        except (ValueError, ValidationError, ZeroDivisionError):
            log.warning("job task %s: its checkpoint in Redis is unreadable; starting from "
                        "the sidecar alone", self.stream.id)  # fmt: skip
            floor = None
        return (floor if floor is not None and floor >= 0 else None), tb

    async def _follow(self) -> None:
        while not self._handed:
            await asyncio.sleep(TICK_S)
            self._watch_losses()
            if self.stream.state is StreamState.FAILED:
                return await self._final("failed", self.stream.error or "failed")
            if self._ended():
                return await self._final("pending")
            if time.monotonic() - self._flushed_at < PROGRESS_EVERY_S:
                continue
            figures = await self._flush()
            if figures.complete:
                if await self._write("done", figures):
                    log.info("job task %s: done, %d frames", self.stream.id, figures.frames_done)
                    self.ledger.settled.set()
                    return None
            elif self._changed(figures) or time.monotonic() - self._written_at > HEARTBEAT_S:
                await self._write("running", figures)

    def _watch_losses(self) -> None:
        lost = sum(self.stream.counters[name] for name in LOST)
        if lost > self._lost_seen:
            self._lost_seen = lost
            self.ledger.lost()

    def _ended(self) -> bool:
        """The stream's decode thread ended without the task's end (stopped or failed)."""
        stream = self.stream
        return stream.state in (StreamState.STOPPED, StreamState.FAILED) and not stream.alive

    def _changed(self, figures: Figures) -> bool:
        now = (figures.checkpoint, figures.frames_done)
        changed, self._last = now != self._last, now
        return changed

    async def _flush(self) -> Figures:
        """Sidecar to disk, then the checkpoint may pass what it holds."""
        self._flushed_at = time.monotonic()
        batch = self.ledger.flushing()
        self.sidecar.flush()
        await asyncio.to_thread(self.sidecar.sync)
        return self.ledger.durable(batch)

    async def _final(self, state: TaskState, error: str | None = None) -> None:
        """The last flush and progress of this run (bounded)."""
        if self._handed:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FINAL_TIMEOUT_S):
                figures = self.ledger.durable(frozenset())
                with contextlib.suppress(OSError, SidecarError):
                    figures = await self._flush()
                for _ in range(math.ceil(FINAL_TIMEOUT_S / RETRY_S)):
                    if await self._write(state, figures, error):
                        return
                    await asyncio.sleep(RETRY_S)

    async def _write(self, state: TaskState, figures: Figures, error: str | None = None) -> bool:
        """``SET`` the checkpoint, then the progress; False when Redis failed."""
        tb = self._time_base
        progress = TaskProgress(
            state=state,
            frames_done=figures.frames_done,
            frames_total=self._total(figures, state),
            checkpoint_pts=figures.checkpoint,
            time_base=(tb.numerator, tb.denominator) if tb is not None else None,
            error=error[:500] if error is not None else None,
            updated_at=time.time(),
            execution_s=None if self.billed_s is None else self._billed_before + self.billed_s,
        )
        try:
            pipe = self._redis.pipeline(transaction=False)
            if figures.checkpoint is not None:
                pipe.set(self._keys[0], str(figures.checkpoint))
            pipe.set(self._keys[1], progress.model_dump_json())
            await pipe.execute()
        except (RedisError, OSError) as exc:
            log.warning("job task %s: cannot write its progress (%s)",
                        self.stream.id, type(exc).__name__)  # fmt: skip
            return False
        self._written_at = time.monotonic()
        return True

    def _total(self, figures: Figures, state: TaskState) -> int | None:
        """Frames the task analyses in all: the container's count (or duration x rate),
        exact once done."""
        if state == "done":
            return figures.frames_done
        info = self.stream.source_info
        if info is None:
            return None
        fps, rate = self.stream.config.fps, info.fps
        total: int | None = None
        if fps <= 0 or (rate > 0 and fps >= rate):
            total = info.frames or (round(info.duration_s * rate) if info.duration_s else None)
        elif info.duration_s:
            total = math.ceil(info.duration_s * fps)
        return None if total is None else max(total, figures.frames_done)


class JobRuns:
    """The ingest's job tasks, by stream id; every result of the ingest passes here."""

    def __init__(
        self,
        redis_url: str | None,
        prefix: str,
        timeout_s: float = 2.0,
        sidecar_dirs: Sequence[Path] = (),
    ) -> None:
        self.prefix = prefix
        self._url = redis_url
        self._timeout_s = timeout_s
        self._sidecar_dirs = tuple(sidecar_dirs)
        """Where task sidecars may be written (``job_sidecar_dirs``; empty: no task)."""
        self._redis: Redis | None = None
        """Connected at the first task (most ingests run none)."""
        self._runs: dict[str, JobRun] = {}
        self._keepers: set[asyncio.Task[None]] = set()

    @classmethod
    def of(cls, settings: IngestSettings) -> JobRuns:
        url = settings.redis_url.get_secret_value() if settings.redis_url else None
        r = settings.results
        return cls(url, r.redis_prefix, r.redis_timeout_s, settings.job_sidecar_dirs)

    def get(self, stream_id: str) -> JobRun | None:
        return self._runs.get(stream_id)

    def check(self, config: StreamConfig) -> None:
        """ConfigError if this ingest cannot run ``config``'s job task: without Redis, or
        with a sidecar outside its ``job_sidecar_dirs`` (:func:`sidecar_problem`)."""
        if config.job is None:
            return
        if self._url is None:
            raise ConfigError(
                f"stream {config.id!r} is a job task: its checkpoint lives in Redis "
                "(set FRAMERELAY_REDIS_URL on the ingest)"
            )
        problem = sidecar_problem(config.job.sidecar, self._sidecar_dirs)
        if problem is not None:
            raise ConfigError(f"stream {config.id!r} is a job task: {problem}")

    def attach(self, stream: IngestStream) -> None:
        """Make ``stream`` (not launched yet) run its config's job task."""
        task = stream.config.job
        self.check(stream.config)
        if task is None or self._url is None:
            return
        if self._redis is None:
            self._redis = connect(self._url, timeout_s=self._timeout_s)
        old = self._runs.get(stream.id)
        if old is not None:
            old.hand_over()
        run = self._runs[stream.id] = JobRun(stream, task, self._redis, self.prefix)
        stream.job = run
        keeper = asyncio.create_task(self._keep(run), name=f"job-{stream.id}")
        self._keepers.add(keeper)
        keeper.add_done_callback(self._keepers.discard)

    async def _keep(self, run: JobRun) -> None:
        try:
            await run.keep()
        except Exception:  # a bug here must not pass unseen; the stream fails alone
            log.exception("job task %s: its keeper failed", run.stream.id)
            run.stream.fail("job task keeper failed (see the ingest's log)")
        finally:
            if self._runs.get(run.stream.id) is run:
                del self._runs[run.stream.id]

    def result_seen(self, record: ResultRecord) -> None:
        """A bus tap: a result of a task stream goes to its sidecar."""
        run = self._runs.get(record.stream_id)
        if run is not None:
            run.result(record)

    async def aclose(self, timeout_s: float = FINAL_TIMEOUT_S + 2.0) -> None:
        """After the streams stopped: let the keepers write their last progress (bounded)."""
        if self._keepers:
            _, late = await asyncio.wait(set(self._keepers), timeout=timeout_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        if self._redis is not None:
            await self._redis.aclose()
