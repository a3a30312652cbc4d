"""A tunnel's frames decode in parallel and reach the batcher in each stream's order.

The decodes run in an executor that finishes them in an order the test chooses
(later frames first), with the real JPEG decoder; no socket.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

import numpy as np
import pytest
import simplejpeg

from framerelay import wire
from framerelay.errors import ProtocolError
from gpu_worker.decoding import Decoding, Image, OrderedDecoder
from gpu_worker.sessions import new_session

SIDE = 64
JPEG = simplejpeg.encode_jpeg(np.full((SIDE, SIDE, 3), 90, np.uint8), colorsubsampling="420")


class HeldExecutor(Executor):
    """Runs each job only when :meth:`finish` names it (by submission index)."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.jobs.append((future, fn, args))
        return future

    def finish(self, index: int) -> None:
        future, fn, args = self.jobs[index]
        try:
            future.set_result(fn(*args))
        except Exception as exc:
            future.set_exception(exc)


def _frame(stream_id: str, seq: int) -> wire.Frame:
    return wire.Frame(
        stream_id=stream_id, epoch=0, seq=seq, pts=seq, time_base=(1, 25),
        captured_at=time.time(), src_w=SIDE, src_h=SIDE, scale=1.0,
    )  # fmt: skip


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_each_stream_keeps_its_order_whatever_finishes_first() -> None:
    delivered: list[tuple[str, int, str]] = []

    def deliver(job: Decoding, outcome: Image | ProtocolError) -> None:
        kind = "error" if isinstance(outcome, ProtocolError) else f"{outcome.shape[0]}px"
        delivered.append((job.frame.stream_id, job.frame.seq, kind))

    pool = HeldExecutor()
    decoder = OrderedDecoder(pool, (SIDE, SIDE), limit=8, deliver=deliver)
    session = new_session("a", "none", 0.1)
    sent = [("a", 0, JPEG), ("b", 0, JPEG), ("a", 1, b"not a jpeg"), ("a", 2, JPEG)]
    for sid, seq, payload in sent:
        await decoder.start(_frame(sid, seq), payload, session)
    assert decoder.pending == 4
    for index in (3, 2, 1):  # a2, a1 (bad), b0 finish before a0
        pool.finish(index)
        await _settle()
    waiting = decoder.pending
    pool.finish(0)
    await _settle()
    left = decoder.pending
    assert (waiting, left) == (3, 0)  # b0 went at once; a1 and a2 waited for a0
    assert delivered == [("b", 0, "64px"), ("a", 0, "64px"), ("a", 1, "error"), ("a", 2, "64px")]


async def test_at_most_limit_decodes_run_then_start_waits() -> None:
    pool = HeldExecutor()
    decoder = OrderedDecoder(pool, (SIDE, SIDE), limit=2, deliver=lambda job, out: None)
    session = new_session("a", "none", 0.1)
    for seq in (0, 1):
        await decoder.start(_frame("a", seq), JPEG, session)
    third = asyncio.create_task(decoder.start(_frame("a", 2), JPEG, session))
    await _settle()
    blocked = not third.done() and len(pool.jobs) == 2
    pool.finish(0)
    await asyncio.wait_for(third, 5)
    assert (blocked, len(pool.jobs) == 3) == (True, True)


async def test_after_close_nothing_is_delivered() -> None:
    delivered: list[int] = []

    pool = HeldExecutor()
    decoder = OrderedDecoder(pool, (SIDE, SIDE), 4, lambda job, out: delivered.append(1))
    await decoder.start(_frame("a", 0), JPEG, new_session("a", "none", 0.1))
    decoder.close()
    pool.finish(0)
    await _settle()
    await decoder.start(_frame("a", 1), JPEG, new_session("a", "none", 0.1))
    assert delivered == []


def test_the_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="limit"):
        OrderedDecoder(HeldExecutor(), (SIDE, SIDE), 0, lambda job, out: None)
