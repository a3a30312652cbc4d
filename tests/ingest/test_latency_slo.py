"""Issue 15: ``latency_slo_ms`` on a stream, the latency histogram and SLO breaches.

Unit checks of :class:`ingest.latency.StreamLatency` (no I/O), and the REST
API refusing bad objectives with a clear 422 (no traceback, nothing created);
the figures moving with real results are in tests/integration/test_latency_slo.py.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from framerelay.results import ResultRecord
from framerelay.wire import Timing
from ingest.latency import BUCKETS_S, PENDING, LatencyFrom, StreamLatency
from ingest.store import FileStore
from tests.support.asgi_ingest import running
from tests.support.bad_numbers import CLEAR


def _timing(seq: int, captured_at: float = 1000.0, epoch: int = 0) -> Timing:
    return Timing(stream_id="s", epoch=epoch, seq=seq, pts=seq * 3000, time_base=(1, 90_000),
                  captured_at=captured_at)  # fmt: skip


def _record(seq: int, latency_ms: float, epoch: int = 0) -> ResultRecord:
    return ResultRecord(
        stream_id="s", epoch=epoch, seq=seq, pts=seq * 3000, time_base=(1, 90_000),
        pts_time=seq / 30, captured_at=1000.0, received_at=1000.0 + latency_ms / 1000,
        latency_ms=latency_ms, worker_id="w", detections=[],
    )  # fmt: skip


@pytest.mark.parametrize(
    ("capture_time", "want_ms", "want_from"),
    [
        (None, 40.0, LatencyFrom.DECODE),  # the source does not say: from decode
        (999.95, 90.0, LatencyFrom.CAPTURE),  # captured 50 ms before decode
        (1000.02, 20.0, LatencyFrom.CAPTURE),  # camera clock a little ahead: believed
        (1000.5, 40.0, LatencyFrom.DECODE),  # 0.5 s in the future: not believed
        (0.0, 40.0, LatencyFrom.DECODE),  # 1000 s behind: not believed
    ],
)
def test_latency_is_from_capture_where_the_source_says(
    capture_time: float | None, want_ms: float, want_from: LatencyFrom
) -> None:
    lat = StreamLatency(None)
    lat.sent(_timing(1), capture_time)
    assert lat.observe(_record(1, 40.0)) == pytest.approx(want_ms)
    assert lat.source is want_from
    assert list(lat.window) == [pytest.approx(want_ms)]


def test_histogram_and_breaches() -> None:
    lat = StreamLatency(100.0)
    for seq, ms in enumerate((5.0, 10.0, 99.0, 100.0, 100.5, 45_000.0)):
        lat.observe(_record(seq, ms))
    buckets, total = lat.histogram()
    assert [b for b, _ in buckets] == [*map(str, BUCKETS_S), "+Inf"]
    cumulative = dict(buckets)
    assert cumulative["0.01"] == 2  # le: 10 ms itself is in the 10 ms bucket
    assert cumulative["0.1"] == 4 and cumulative["30.0"] == 5 and cumulative["+Inf"] == 6
    assert [n for _, n in buckets] == sorted(n for _, n in buckets)
    assert total == pytest.approx((5 + 10 + 99 + 100 + 100.5 + 45_000) / 1000)
    assert lat.breaches == 2  # 100.5 and 45 s; exactly the objective is not a breach
    info = lat.describe()
    assert info["latency_slo_ms"] == 100.0 and info["slo_breaches"] == 2
    assert info["latency_from"] == "decode" and info["latency_p50_ms"] == pytest.approx(99.5)


def test_no_objective_no_breaches_and_bounded_memory() -> None:
    lat = StreamLatency(None)
    for seq in range(PENDING * 3):  # frames sent whose results never come (replaced, lost)
        lat.sent(_timing(seq), 999.9)
    assert len(lat._lags) == PENDING
    assert lat.observe(_record(0, 1e6)) == pytest.approx(1e6)  # forgotten: from decode
    assert lat.observe(_record(PENDING * 3 - 1, 10.0)) == pytest.approx(110.0)
    assert lat.breaches == 0 and lat.describe()["latency_slo_ms"] is None


def test_an_unbelievable_camera_clock_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    lat = StreamLatency(None)
    with caplog.at_level(logging.WARNING, logger="ingest.latency"):
        for seq in range(5):
            lat.sent(_timing(seq), 5000.0)
    assert len(caplog.records) == 1
    assert "ahead of" in caplog.text and "synchronised" in caplog.text


# -- the API ---------------------------------------------------------------------------

BAD = [("nan", "NaN"), ("inf", "Infinity"), ("-inf", "-Infinity"), ("zero", "0"),
       ("negative", "-5"), ("huge", "1e308"), ("over", "600001")]  # fmt: skip


@pytest.mark.parametrize("method", ["POST", "PUT"])
@pytest.mark.parametrize(("label", "raw"), BAD, ids=[b[0] for b in BAD])
async def test_bad_objectives_are_a_clear_422(
    method: str, label: str, raw: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    body = json.dumps({"id": "cam", "url": "/nonexistent/x.mp4", "latency_slo_ms": "@@"})
    body = body.replace('"@@"', raw)
    path = "/v1/streams" if method == "POST" else "/v1/streams/cam"

    caplog.set_level(logging.ERROR)
    async with running(FileStore(tmp_path / "s.json")) as (service, http):
        r = await http.request(
            method, path, content=body, headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 422, r.text
        assert "Traceback" not in r.text
        errors = r.json()["detail"]
        assert [e["loc"] for e in errors] == [["body", "latency_slo_ms"]], errors
        assert not [e for e in errors if "input" in e], errors  # never echoed
        assert all(any(c in e["msg"] for c in CLEAR) for e in errors), errors
        assert not service.streams
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


async def test_objective_set_shown_changed_and_its_series_removed(tmp_path: Path) -> None:
    # a file that is not there, under the roots the API may read (tests/conftest.py)
    cam = {"id": "cam", "url": str(tmp_path / "missing.mp4"), "latency_slo_ms": 250}

    async with running(FileStore(tmp_path / "s.json")) as (_service, http):
        r = await http.post("/v1/streams", json=cam)
        assert r.status_code == 201, r.text
        got = r.json()
        assert got["config"]["latency_slo_ms"] == 250 and got["latency_slo_ms"] == 250
        assert got["latency_from"] == "decode" and got["slo_breaches"] == 0
        text = (await http.get("/metrics")).text
        assert 'framerelay_ingest_latency_slo_seconds{stream="cam"} 0.25' in text
        assert 'framerelay_ingest_slo_breaches_total{stream="cam"} 0.0' in text
        assert 'framerelay_ingest_result_latency_seconds_count{stream="cam"} 0.0' in text
        r = await http.put("/v1/streams/cam", json={**cam, "latency_slo_ms": None})
        assert r.status_code == 200 and r.json()["latency_slo_ms"] is None
        text = (await http.get("/metrics")).text
        assert 'latency_slo_seconds{stream="cam"}' not in text
        assert 'slo_breaches_total{stream="cam"}' not in text
        assert (await http.delete("/v1/streams/cam")).status_code == 204
        assert 'stream="cam"' not in (await http.get("/metrics")).text
