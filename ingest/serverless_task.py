"""A stream served by a RunPod serverless endpoint instead of a tunnel (a job task on a
serverless tier).

:func:`send_serverless` is the serverless counterpart of
:func:`ingest.tunnel_sender.send_stream`: it takes every frame the stream offers
(``stream.slot``, already sampled, letterboxed and encoded by the decode thread) and
hands it to a :class:`~ingest.serverless_sink.ServerlessSink`, which posts the frames
in batches to the endpoint (``/run``, polled on ``/status``). Each answered frame
becomes a :class:`~framerelay.results.ResultRecord` carrying the frame's timing
unchanged (as a tunnel RESULT would) and goes to ``publish``: the ingest's result bus,
whose tap writes a job task's sidecar under the frame's own id and lets its checkpoint
pass (:mod:`ingest.job_task`). Nothing here knows about checkpoints: the job side is
the same for both paths.

A batch that fails for good (the link's request retries and the sink's job resubmits
used up, or an unusable answer) counts its frames under the stream's ``worker_error``,
the counter a job task watches for frames that will never be answered: it reads its
input again from its checkpoint, and frames answered twice are written once.

An open batch goes out when full or when no frame came for ``linger_s`` (the end of
the input, or a slow decoder), so the last frames are never held back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from framerelay import wire
from framerelay.errors import ConfigError, FramerelayError
from framerelay.jobs import EndpointUrls
from framerelay.results import ResultRecord
from ingest.handoff import SlotClosed
from ingest.job_task import JobRun
from ingest.serverless_link import (
    ServerlessError,
    ServerlessLink,
    ServerlessSettings,
    endpoint_urls,
)
from ingest.serverless_sink import FrameResult, ServerlessSink, SinkFrame
from ingest.settings import StreamConfig
from ingest.stream import IngestStream

log = logging.getLogger(__name__)
Publish = Callable[[ResultRecord], None]


@dataclass(frozen=True, slots=True)
class Batching:
    """How a stream's frames are grouped into serverless jobs."""

    max_frames: int = 32
    max_jobs: int = 4
    """Jobs out at once (so at most ``max_frames * max_jobs`` frames in flight)."""
    attempts: int = 3
    linger_s: float = 0.2


def record_of(result: FrameResult, endpoint_id: str) -> ResultRecord:
    """The result record of a serverless answer: the frame's timing unchanged, the
    worker named ``serverless:<endpoint>/<worker>``, the job's timings (of its whole
    batch) as ``batch_<stage>_ms``."""
    det = result.detections
    header = wire.build(
        wire.Result, **result.frame.timing.timing_fields(), n=len(det),
        timings={f"batch_{k}": v for k, v in list(result.timings.items())[: wire.MAX_TIMINGS]},
        model=result.model,
    )  # fmt: skip
    worker = f"serverless:{endpoint_id}/{result.worker_id}"[:128]
    return ResultRecord.build(
        header, det, class_names=result.class_names, worker_id=worker, received_at=time.time()
    )


class ServerlessSender:
    """Feeds one stream's frames to an endpoint and publishes the answers (see module)."""

    def __init__(
        self,
        stream: IngestStream,
        link: ServerlessLink,
        publish: Publish,
        batching: Batching = Batching(),
    ) -> None:
        self.stream = stream
        self.link = link
        self.publish = publish
        self.batching = batching
        self.sink = ServerlessSink(
            link, self._answered, model=stream.config.model, max_frames=batching.max_frames,
            max_jobs=batching.max_jobs, attempts=batching.attempts, on_lost=self._lost,
        )  # fmt: skip

    async def run(self) -> None:
        """Until the stream's slot closes (the stream stopped); then the jobs out are
        waited for (their answers still count) and the stream's sender is idle."""
        self.stream.sender_started()
        try:
            await self._pump()
            await self.sink.drain()
        finally:
            await self.sink.aclose()
            self.stream.sender_stopped()

    async def _pump(self) -> None:
        while True:
            try:
                out = await asyncio.wait_for(self.stream.slot.get(), self.batching.linger_s)
            except TimeoutError:
                await self.sink.flush()
                continue
            except SlotClosed:
                return
            await self.sink.put(SinkFrame(out.timing, out.prepared))
            self.stream.counters["sent"] += 1

    async def _answered(self, results: list[FrameResult]) -> None:
        self._billed()
        for result in results:
            try:
                record = record_of(result, self.link.endpoint_id)
            except (FramerelayError, ValueError) as exc:
                self._lost([result.frame], ServerlessError(f"unusable answer: {exc}"))
                continue
            self.stream.counters["results"] += 1
            self.stream.latency.observe(record)
            self.publish(record)
        self.stream.unstall("the serverless endpoint answers")

    def _billed(self) -> None:
        """The stream's job task reports the worker time billed so far (before the frames
        it was billed for are on disk, so a task done has it all)."""
        if isinstance(self.stream.job, JobRun):
            self.stream.job.billed_s = self.link.execution_s

    def _lost(self, batch: list[SinkFrame], error: ServerlessError) -> None:
        self._billed()
        self.stream.counters["worker_error"] += len(batch)
        self.stream.last_error = f"serverless: {error}"[:300]


class ServerlessRuns:
    """The ingest's streams served by serverless endpoints: a job task whose
    ``job.serverless_endpoint_id`` is set runs here from its start, never on a tunnel
    (the registry's hook, :meth:`serves` then :meth:`start`)."""

    def __init__(
        self,
        settings: ServerlessSettings,
        publish: Publish,
        batching: Batching = Batching(),
        input_size: tuple[int, int] = (416, 416),
    ) -> None:
        self.settings = settings
        self.publish = publish
        self.batching = batching
        self.input_size = input_size
        self._tasks: dict[str, asyncio.Task[None]] = {}

    @staticmethod
    def endpoint_of(config: StreamConfig) -> str | None:
        job = config.job
        return None if job is None else job.serverless_endpoint_id

    def check(self, config: StreamConfig) -> None:
        """ConfigError if ``config`` names an endpoint and this ingest has no RunPod key,
        or its endpoint's request URLs are not on the RunPod endpoint API set here."""
        endpoint = self.endpoint_of(config)
        if endpoint is None:
            return
        if self.settings.api_key is None:
            raise ConfigError(
                f"stream {config.id!r} runs on a RunPod serverless endpoint: set the RunPod "
                "API key (FRAMERELAY_INGEST_SERVERLESS__API_KEY or ..._API_KEY_FILE)"
            )
        if config.job is not None:
            endpoint_urls(self.settings, endpoint, config.job.serverless_urls)

    def serves(self, config: StreamConfig) -> bool:
        return self.endpoint_of(config) is not None

    def start(self, stream: IngestStream) -> None:
        """Serve ``stream`` (not launched yet) from its endpoint until it stops."""
        endpoint = self.endpoint_of(stream.config)
        if endpoint is None:
            raise ValueError(f"stream {stream.id!r} names no serverless endpoint")
        self.check(stream.config)
        old = self._tasks.pop(stream.id, None)
        if old is not None:
            old.cancel()
        job = stream.config.job
        urls = job.serverless_urls if job is not None else None
        coro = serve_stream(
            stream, self.settings, endpoint, self.publish, self.batching, self.input_size, urls
        )
        task = asyncio.create_task(self._guarded(stream, coro), name=f"serverless-{stream.id}")
        self._tasks[stream.id] = task
        task.add_done_callback(lambda t: self._forget(stream.id, t))

    @staticmethod
    async def _guarded(stream: IngestStream, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except (FramerelayError, OSError) as exc:
            stream.fail(f"serverless: {exc}"[:300])
        except Exception:  # a bug here must not pass unseen; the stream fails alone
            log.exception("stream %s: its serverless sender failed", stream.id)
            stream.fail("serverless sender failed (see the ingest's log)")

    def _forget(self, stream_id: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(stream_id) is task:
            del self._tasks[stream_id]

    async def aclose(self, timeout_s: float = 10.0) -> None:
        """After the streams stopped: their senders end (bounded; the jobs still out are
        waited for, then cancelled on the endpoint)."""
        tasks = list(self._tasks.values())
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=timeout_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)


async def serve_stream(
    stream: IngestStream,
    settings: ServerlessSettings,
    endpoint_id: str,
    publish: Publish,
    batching: Batching = Batching(),
    input_size: tuple[int, int] = (416, 416),
    urls: EndpointUrls | None = None,
) -> None:
    """Run ``stream`` on the endpoint until it stops: the model input size is set (the
    endpoint's model; no HELLO tells it), its decode thread started, its frames sent.
    ``urls``: the endpoint's request URLs when the orchestrator manages it."""
    async with ServerlessLink(settings, endpoint_id, urls=urls) as link:
        stream.start(*input_size)
        sender = ServerlessSender(stream, link, publish, batching)
        try:
            await sender.run()
        finally:
            sink = sender.sink
            log.info("stream %s on serverless endpoint %s: %d jobs (%d submitted again, %d "
                     "batches lost), %d frames answered, %.1f s of worker time",
                     stream.id, endpoint_id, sink.jobs, sink.resubmits, sink.batches_lost,
                     sink.frames_answered, link.execution_s)  # fmt: skip
