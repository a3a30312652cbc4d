"""The stream management REST API on a real service (no worker: frames count ``no_credit``)."""

from __future__ import annotations

import asyncio
import json
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from ingest.service import IngestService
from ingest.settings import StreamConfig
from ingest.store import FileStore, RedisStore
from ingest.stream import COUNTERS
from ingest.streams_api import StreamStatus
from tests.support.asgi_ingest import running
from tests.support.media import Media
from tests.support.servers import RedisServer
from tests.support.waiting import wait_until_async


def _cam(media: Media, sid: str, **extra: Any) -> dict[str, Any]:
    return {"id": sid, "url": str(media.short("mp4")), "realtime": True, "loop": True, **extra}


def _running(service: IngestService, sid: str) -> bool:
    return service.streams[sid].state.value == "RUNNING"


async def _state(http: httpx.AsyncClient, sid: str) -> str:
    return str((await http.get(f"/v1/streams/{sid}")).json()["state"])


async def test_add_list_update_remove_and_resume(media: Media, tmp_path: Path) -> None:
    store = FileStore(tmp_path / "streams.json")

    async with running(store) as (service, http):
        for sid in ("a", "b", "c"):
            r = await http.post("/v1/streams", json=_cam(media, sid))
            assert r.status_code == 201, r.text
        assert {s["id"] for s in (await http.get("/v1/streams")).json()} == {"a", "b", "c"}
        await wait_until_async(
            lambda: service.streams["a"].counters["decoded"] > 0, 10, "a decodes"
        )
        a = (await http.get("/v1/streams/a")).json()
        assert a["state"] == "RUNNING" and a["no_credit"] > 0 and a["prepared"] == 0
        assert [h["state"] for h in a["history"]] == ["STARTING", "RUNNING"]
        r = await http.put("/v1/streams/b", json=_cam(media, "b", fps=2))
        assert r.status_code == 200 and r.json()["config"]["fps"] == 2
        assert r.json()["epoch"] == 1  # a new definition continues the epochs
        c = service.streams["c"]
        assert (await http.delete("/v1/streams/c")).status_code == 204
        assert (await http.get("/v1/streams/c")).status_code == 404
        assert (await http.delete("/v1/streams/c")).status_code == 404
        assert "c" not in service.streams and "c" not in service.client.snapshots
        await wait_until_async(lambda: not c.alive, 10, "c's decode thread to end")
        assert c.state.value == "STOPPED"
    saved = json.loads((tmp_path / "streams.json").read_text())
    assert [s["id"] for s in saved["streams"]] == ["a", "b"]
    assert (tmp_path / "streams.json").stat().st_mode & 0o777 == 0o600
    async with running(store) as (service, _):
        assert set(service.streams) == {"a", "b"}
        assert service.streams["b"].config.fps == 2
        for sid in ("a", "b"):
            await wait_until_async(partial(_running, service, sid), 10, sid)


async def test_bad_requests_are_refused_without_echoing_secrets(
    media: Media, tmp_path: Path
) -> None:
    async with running(FileStore(tmp_path / "s.json")) as (service, http):
        body = _cam(media, "x", password="hunter2-secret", username="u")
        r = await http.post("/v1/streams", json={**body, "colour": "red"})
        assert r.status_code == 422 and "extra_forbidden" in r.text
        assert "hunter2" not in r.text and "/short.mp4" not in r.text
        r = await http.post(
            "/v1/streams",
            json=_cam(media, "y", url="rtsp://u:hunter2-secret@h/x", username="u"),
        )
        assert r.status_code == 422 and "credentials given twice" in r.text
        assert "hunter2" not in r.text
        r = await http.post("/v1/streams", json={**body, "id": "bad id!"})
        assert r.status_code == 422
        r = await http.post("/v1/streams", json=_cam(media, "f", username="u"))
        assert r.status_code == 422 and "need an rtsp" in r.text  # a file has no user
        assert (await http.post("/v1/streams", json=_cam(media, "d"))).status_code == 201
        assert (await http.post("/v1/streams", json=_cam(media, "d"))).status_code == 409
        r = await http.put("/v1/streams/d", json=_cam(media, "e"))
        assert r.status_code == 422 and "differs" in r.text
        assert (await http.put("/v1/streams/zz", json=_cam(media, "zz"))).status_code == 404
        r = await http.post(
            "/v1/streams",
            json=_cam(media, "p", url="rtsp://h/x", username="u", password="hunter2-secret"),
        )
        assert r.status_code == 201 and r.json()["config"]["password"] == "***"
        listing = (await http.get("/v1/streams")).text + (await http.get("/metrics")).text
        assert "hunter2" not in listing
        assert set(service.streams) == {"d", "p"}


@pytest.mark.integration
async def test_store_down_changes_nothing(media: Media, tmp_path: Path) -> None:
    redis = RedisServer(tmp_path / "redis").start()
    store = RedisStore(redis.url, "test:streams")

    try:
        async with running(store) as (service, http):
            assert (await http.post("/v1/streams", json=_cam(media, "a"))).status_code == 201
            await asyncio.to_thread(
                redis.stop
            )  # Redis goes away: changes are refused, nothing half-done
            r = await http.post("/v1/streams", json=_cam(media, "b"))
            assert r.status_code == 503 and "cannot write the Redis hash" in r.text
            assert (await http.delete("/v1/streams/a")).status_code == 503
            assert set(service.streams) == {"a"}
        await store.close()
    finally:
        redis.stop()


async def test_openapi_metrics_and_status_model(media: Media, tmp_path: Path) -> None:
    assert set(COUNTERS) <= set(StreamStatus.model_fields)

    async with running(FileStore(tmp_path / "s.json")) as (service, http):
        spec = (await http.get("/openapi.json")).json()
        assert {"/v1/streams", "/v1/streams/{stream_id}"} <= set(spec["paths"])
        assert set(spec["paths"]["/v1/streams/{stream_id}"]) == {"get", "put", "delete"}
        assert "StreamConfig" in spec["components"]["schemas"]
        await http.post("/v1/streams", json=_cam(media, "m"))
        await wait_until_async(lambda: service.streams["m"].counters["decoded"] > 0, 10, "decoding")
        text = (await http.get("/metrics")).text
        assert 'framerelay_ingest_stream_state{state="RUNNING",stream="m"} 1.0' in text
        assert 'framerelay_ingest_stream_frames_decoded_total{stream="m"}' in text
        assert 'framerelay_ingest_stream_frames_total{outcome="dropped",stream="m"}' in text
        assert (
            'framerelay_ingest_stream_source_failures_total{reason="stall",stream="m"} 0.0' in text
        )
        assert 'framerelay_ingest_tunnel_connected{worker="default"} 0.0' in text
        await http.delete("/v1/streams/m")
        assert 'stream="m"' not in (await http.get("/metrics")).text


@pytest.mark.parametrize("field", ["url", "password"])
def test_stored_definition_keeps_secrets_but_answers_mask_them(field: str) -> None:
    cfg = StreamConfig(id="s", url="rtsp://u:pw1@h/x") if field == "url" else StreamConfig(
        id="s", url="rtsp://h/x", username="u", password="pw1"
    )  # fmt: skip
    assert "pw1" in json.dumps(cfg.stored())
    assert "pw1" not in json.dumps(cfg.public())
