"""The console's data routes without a browser: the frames kept for the live view, the
table's rows, and the cap on open event streams (issue 15)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx

from framerelay.data import DEFAULT_CLIP
from framerelay.geometry import Letterbox
from ingest import console
from ingest.console_frames import SentFrame, SentFrames
from ingest.prepare import Prepared
from tests.support.auth import ed_keys
from tests.support.ingest_api import running_ingest


def frame(seq: int, epoch: int = 1) -> SentFrame:
    lb = Letterbox.fit(640, 480, 416, 416)
    return SentFrame(epoch, seq, seq * 3600, Prepared(b"jpeg-%d" % seq, lb))


def test_sent_frames_are_bounded_and_each_is_taken_once() -> None:
    kept = SentFrames(size=4)
    for seq in range(10):
        kept.remember(frame(seq))
    assert len(kept) == 4  # the newest 4
    assert kept.take(1, 3) is None  # pushed out
    got = kept.take(1, 7)
    assert got is not None and got.prepared.data == b"jpeg-7"
    assert kept.take(1, 7) is None  # a result comes once
    assert kept.take(1, 6) is None and len(kept) == 2  # older than a taken one: forgotten
    assert kept.take(2, 8) is None  # another epoch is another frame


def test_frame_event_carries_the_result_and_its_jpeg(tmp_path: Path) -> None:
    from framerelay.results import ResultId, ResultRecord
    from ingest.bus import Published

    record = ResultRecord(stream_id="cam-1", epoch=1, seq=7, pts=7 * 3600, time_base=(1, 90_000),
                          pts_time=0.28, captured_at=1.0, received_at=1.05, latency_ms=50.0,
                          worker_id="w", detections=[])  # fmt: skip
    item = Published.settled(record, ResultId(1000, 0))
    body = json.loads(console.frame_event(item, frame(7)))
    assert body["result"]["seq"] == 7 and body["result"]["id"] == "1000-0"
    assert body["frame"]["new_w"] == 416 and body["frame"]["new_h"] == 312
    assert body["frame"]["jpeg"] == "anBlZy03"  # base64 of b"jpeg-7"


async def test_at_most_max_viewers_event_streams_are_open(tmp_path: Path) -> None:
    async with running_ingest(ed_keys(), tmp_path) as ingest:
        headers = ingest.auth("streams:read")
        async with httpx.AsyncClient(base_url=ingest.base, timeout=10) as http:
            body = {"id": "cam-1", "url": str(DEFAULT_CLIP), "realtime": True, "loop": True}
            r = await http.post("/v1/streams", json=body, headers=ingest.auth("streams:write"))
            assert r.status_code == 201
            opened, readers = [], []
            for _ in range(console.MAX_VIEWERS):
                req = http.build_request("GET", "/v1/console/streams", headers=headers)
                resp = await http.send(req, stream=True)
                assert resp.status_code == 200
                lines = resp.aiter_lines()  # kept: dropping it closes the response
                assert await anext(lines) == "event: streams"
                opened.append(resp)
                readers.append(lines)
            over = await http.get("/v1/console/streams", headers=headers)
            assert over.status_code == 503 and "close one first" in over.json()["detail"]
            await opened.pop().aclose()
            for _ in range(50):  # the server sees the close at its next write (1 s)
                probe = await http.send(
                    http.build_request("GET", "/v1/console/streams", headers=headers),
                    stream=True,
                )
                if probe.status_code == 200:
                    opened.append(probe)
                    break
                await probe.aclose()
                await asyncio.sleep(0.1)
            assert opened[-1].status_code == 200  # a closed view frees its place
            for resp in opened:
                await resp.aclose()


async def test_a_live_view_of_an_unknown_stream_is_404_after_the_token(tmp_path: Path) -> None:
    async with running_ingest(ed_keys(), tmp_path) as ingest:
        async with httpx.AsyncClient(base_url=ingest.base, timeout=10) as http:
            path = "/v1/console/streams/nope/live"
            assert (await http.get(path)).status_code == 401
            wrong = await http.get(path, headers=ingest.auth("results:other"))
            assert wrong.status_code == 403
            missing = await http.get(path, headers=ingest.auth("results:*"))
            assert missing.status_code == 404 and "nope" in missing.json()["detail"]
