"""The one-slot mailbox between a decode thread and the event loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from ingest.handoff import LatestSlot, SlotClosed


async def test_live_slot_newest_wins_and_reports_replaced() -> None:
    slot: LatestSlot[int] = LatestSlot(asyncio.get_running_loop())
    assert slot.put(1) is None
    assert slot.put(2) == 1
    assert slot.put(3) == 2
    assert await slot.get() == 3
    assert slot.empty()


async def test_lossless_slot_blocks_producer_until_taken() -> None:
    async with asyncio.timeout(20):
        slot: LatestSlot[int] = LatestSlot(asyncio.get_running_loop(), lossless=True)
        got: list[int] = []

        def produce() -> None:
            for i in range(50):
                assert slot.put(i) is None
            slot.close()

        t = threading.Thread(target=produce)
        t.start()
        try:
            while True:
                got.append(await slot.get())
                await asyncio.sleep(0)
        except SlotClosed:
            pass
        t.join(5)
        assert got == list(range(50))


async def test_close_wakes_waiting_consumer_and_producer() -> None:
    async with asyncio.timeout(5):
        slot: LatestSlot[int] = LatestSlot(asyncio.get_running_loop(), lossless=True)
        waiter = asyncio.create_task(slot.get())
        await asyncio.sleep(0.01)
        slot.close()
        with pytest.raises(SlotClosed):
            await waiter
        with pytest.raises(SlotClosed):
            slot.put(1)


async def test_put_from_thread_wakes_consumer_quickly() -> None:
    async with asyncio.timeout(5):
        slot: LatestSlot[float] = LatestSlot(asyncio.get_running_loop())
        threading.Timer(0.05, lambda: slot.put(time.monotonic())).start()
        sent = await slot.get()
        elapsed = time.monotonic() - sent
    assert elapsed < 0.05
