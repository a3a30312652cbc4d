"""Issue 15: end-to-end latency against each stream's SLO, with real results.

A real worker process (the session's), the real ingest service and API
in-process, and a real RTSP server (GStreamer, which sends RTCP sender
reports): the RTSP stream's latency is measured from capture (the camera's
clock, via FFmpeg's ``start_time_realtime``), the file's from decode; the
histogram and the breach counter move with the results; a deleted stream's
series are gone.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import pytest

from framerelay.launcher import LocalWorker
from ingest.app import create_app
from ingest.service import IngestService
from ingest.settings import IngestSettings
from ingest.store import MemoryStore
from tests.support.auth import mint
from tests.support.fixtures import media  # noqa: F401 - fixture
from tests.support.media import Media
from tests.support.servers import RtspServer
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.integration
HIST = "framerelay_ingest_result_latency_seconds"


def series(text: str, name: str, stream: str) -> dict[str, float]:
    """``{labels without stream: value}`` of one metric's samples for ``stream``."""
    out: dict[str, float] = {}
    for m in re.finditer(rf"^{name}\{{(.*)\}} (\S+)$", text, re.MULTILINE):
        labels = m[1].split(",")
        if f'stream="{stream}"' in labels:
            out[",".join(x for x in labels if not x.startswith("stream="))] = float(m[2])
    return out


async def _check_stream(
    http: httpx.AsyncClient, sid: str, slo_ms: float, clock: str, all_breach: bool
) -> None:
    status = (await http.get(f"/v1/streams/{sid}")).json()
    assert status["latency_slo_ms"] == slo_ms and status["latency_from"] == clock, status
    assert 0 < status["latency_p50_ms"] <= status["latency_p99_ms"] < 30_000, status
    text = (await http.get("/metrics")).text
    count = series(text, HIST + "_count", sid)[""]
    buckets = series(text, HIST + "_bucket", sid)
    assert buckets['le="+Inf"'] == count >= 3
    assert list(buckets.values()) == sorted(buckets.values())
    assert 0 < series(text, HIST + "_sum", sid)[""] < 30 * count
    breaches = series(text, "framerelay_ingest_slo_breaches_total", sid)[""]
    assert breaches == (count if all_breach else 0), (breaches, count)
    assert series(text, "framerelay_ingest_latency_slo_seconds", sid)[""] == slo_ms / 1000
    from_ = series(text, "framerelay_ingest_stream_latency_from", sid)
    assert from_ == {
        f'clock="{clock}"': 1.0,
        f'clock="{"decode" if clock == "capture" else "capture"}"': 0.0,
    }


async def test_latency_histogram_breaches_and_clock(
    local_worker: LocalWorker,
    secret: str,
    media: Media,  # noqa: F811
) -> None:
    settings = IngestSettings(worker_url=local_worker.url, token_secrets=secret,
                              worker_id="test-worker")  # fmt: skip
    token = mint(secret, ["streams:read", "streams:write", "metrics:read"], "ingest", ttl=600)
    file_cam: dict[str, Any] = {
        "id": "file", "url": str(media.short("mp4")), "fps": 5, "realtime": True, "loop": True,
        "latency_slo_ms": 600_000,
    }  # fmt: skip

    with RtspServer(media.h264_clip()) as cam:
        cam.start()
        service = IngestService(settings, store=MemoryStore())
        stop = asyncio.Event()
        task = asyncio.create_task(service.run(stop))
        transport = httpx.ASGITransport(app=create_app(service))
        auth = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://ingest", headers=auth
        ) as http:
            try:
                rtsp = {"id": "rtsp", "url": cam.url, "fps": 5, "latency_slo_ms": 0.001}
                for body in (file_cam, rtsp):
                    assert (await http.post("/v1/streams", json=body)).status_code == 201
                streams = service.streams

                def ready() -> bool:
                    lat = streams["rtsp"].latency
                    return (
                        lat.source.value == "capture"
                        and len(lat.window) >= 3
                        and all(s.counters["results"] >= 3 for s in streams.values())
                    )

                await wait_until_async(
                    ready, 60, "results of both streams, the RTSP one from capture"
                )
                await _check_stream(http, "rtsp", 0.001, "capture", all_breach=True)
                await _check_stream(http, "file", 600_000, "decode", all_breach=False)
                for sid in ("rtsp", "file"):
                    assert (await http.delete(f"/v1/streams/{sid}")).status_code == 204
                text = (await http.get("/metrics")).text
                assert "stream=" not in text, [x for x in text.splitlines() if "stream=" in x][:5]
            finally:
                stop.set()
                await asyncio.wait_for(task, 30)
