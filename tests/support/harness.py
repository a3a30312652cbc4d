"""Run ingest streams without a worker: a consumer takes every frame the stream offers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from ingest.handoff import SlotClosed
from ingest.settings import StreamConfig
from ingest.stream import IngestStream, Outgoing
from tests.conftest import TIMEOUT_FACTOR
from tests.support.waiting import wait_until_async


async def _consume(stream: IngestStream, into: list[Outgoing]) -> None:
    with contextlib.suppress(SlotClosed):
        while True:
            into.append(await stream.slot.get())


@contextlib.asynccontextmanager
async def standalone(
    config: StreamConfig,
    size: tuple[int, int] = (416, 416),
    kind: type[IngestStream] = IngestStream,
) -> AsyncIterator[tuple[IngestStream, list[Outgoing]]]:
    """A started stream whose every offered frame is collected (as if sent at once)."""
    stream = kind(config, asyncio.get_running_loop(), 4)
    stream.start(*size)
    got: list[Outgoing] = []
    consumer = asyncio.create_task(_consume(stream, got))
    try:
        yield stream, got
    finally:
        stream.stop()
        await asyncio.to_thread(stream.join, 15 * TIMEOUT_FACTOR)
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
        assert not stream.alive, f"decode thread of {stream.id} did not end"


async def run_to_end(
    config: StreamConfig, timeout_s: float = 30
) -> tuple[IngestStream, list[Outgoing]]:
    """Run ``config`` standalone until its source ends; the stream and every frame it sent."""
    async with standalone(config) as (stream, got):
        await wait_until_async(lambda: stream.finished, timeout_s, f"{config.id} to end")
    return stream, got
