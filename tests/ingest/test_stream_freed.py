"""A removed stream's memory goes back at once, not at the collector's next full pass.

Issue 11's soaks: the ingest's live memory grew about 6-7 MB/h with faults coming and
going, and the count of IngestStream objects with it (7 -> 14 in 37 minutes) while the
API listed the same streams. A removed stream's decode source kept callbacks that point
back at the stream: a reference cycle, freed only by a full collection, and the ingest
freezes its start-up heap, so full passes are rare. Each such stream held its scaler
(FFmpeg's swscale contexts) and canvases: what the jemalloc profiles showed growing.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from functools import partial
from pathlib import Path

from framerelay.data import DEFAULT_CLIP
from ingest.service import IngestService
from ingest.settings import StreamConfig
from tests.support.auth import ed_keys
from tests.support.ingest_api import settings_for
from tests.support.waiting import wait_until_async


def decoded(counters: dict[str, int]) -> bool:
    return counters["decoded"] >= 5


async def test_a_removed_stream_is_freed_without_the_cyclic_collector(tmp_path: Path) -> None:
    service = IngestService(settings_for(ed_keys(), tmp_path))
    stop = asyncio.Event()
    run = asyncio.create_task(service.run(stop))
    await asyncio.wait_for(service.started.wait(), 10)
    config = StreamConfig(id="cam-1", url=str(DEFAULT_CLIP), realtime=True, loop=True)
    gone = []
    gc.disable()  # only reference counting from here
    try:
        for _ in range(3):
            stream = await service.create_stream(config)
            await wait_until_async(partial(decoded, stream.counters), 10, "frames decoded")
            ref = weakref.ref(stream)
            del stream
            await service.remove_stream("cam-1")
            for _ in range(50):  # the decode thread ends, then the sender task
                if ref() is None:
                    break
                await asyncio.sleep(0.1)
            gone.append(ref() is None)
    finally:
        gc.enable()
        stop.set()
        await asyncio.wait_for(run, 30)
    assert all(gone), f"removed streams still alive without a full collection: {gone}"
