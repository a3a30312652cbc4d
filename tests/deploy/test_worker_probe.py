"""Issue 11: the orchestrator's heartbeat reads the worker's ``/readyz``.

A fake worker (a real HTTP server on 127.0.0.1) answers ``/healthz`` 200 and
``/readyz`` 503 with a reason: the probe reports the worker alive but not ready,
with that reason (one printable line), and runs no canary; the fleet takes a
ready worker's streams away on that first probe and replaces it once the
failures reach ``unhealthy_after``. Implausible capacities from ``/info``
(NaN, Infinity, huge) count as unknown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from fastapi import FastAPI, Response

from deploy.clock import FakeClock
from deploy.fleet import Fleet
from deploy.health import Canary, Probe, WorkerProber
from deploy.models import PodRecord
from tests.support.orchestrator import orch_settings, serving_here
from tests.support.servers import free_port

REASON = "inference loop ended: RuntimeError: boom"


def _worker(ready: bool, info: bytes = b'{"capacity_fps": 30}') -> FastAPI:
    app = FastAPI()

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response("ok\n")

    @app.get("/readyz")
    async def readyz() -> Response:
        if ready:
            return Response("ready\n")
        return Response(f"{REASON}\n\x1b[31m\tmore\n", status_code=503)

    @app.get("/info")
    async def worker_info() -> Response:
        return Response(info, media_type="application/json")

    return app


class _NoCanary(Canary):
    async def run(self, *args: Any, **kwargs: Any) -> tuple[int, float]:
        raise AssertionError("no canary for a worker that is not ready")


async def _probe(app: FastAPI, canary: bool) -> Probe:
    prober = WorkerProber(_NoCanary(), lambda name: "token", heartbeat_timeout_s=2)
    try:
        async with serving_here(app) as url:
            tunnel = f"ws://127.0.0.1:{free_port()}/v1/tunnel"
            return await prober.probe("w", tunnel, url, canary=canary)
    finally:
        await prober.aclose()


async def test_a_503_readyz_is_not_ready_with_the_workers_reason_and_no_canary() -> None:
    probe = await _probe(_worker(ready=False), canary=True)
    assert probe.alive is True and probe.ready is False and probe.canary_ok is None
    assert probe.error == f"worker not ready: HTTP 503: {REASON} [31m more"


@pytest.mark.parametrize(
    ("info", "capacity"),
    [
        (b'{"capacity_fps": 30}', 30.0),
        (b'{"capacity_fps": NaN}', 0.0),
        (b'{"capacity_fps": Infinity}', 0.0),
        (b'{"capacity_fps": -5}', 0.0),
        (b'{"capacity_fps": 1e308}', 0.0),
        (b'{"capacity_fps": 1' + b"0" * 400 + b"}", 0.0),
        (b'{"capacity_fps": "fast"}', 0.0),
    ],
)
async def test_implausible_capacities_count_as_unknown(info: bytes, capacity: float) -> None:
    probe = await _probe(_worker(ready=True, info=info), canary=False)
    assert probe.alive is True and probe.ready is True and probe.error is None
    assert probe.capacity_fps == capacity


def _fleet(tmp_path: Path) -> Fleet:
    none = cast(Any, None)  # _apply_probe touches neither provider, store nor links
    settings = orch_settings(tmp_path, unhealthy_after=2)
    return Fleet(settings, none, none, none, none, FakeClock(1000.0))


def test_the_fleet_drops_an_unready_worker_at_once_and_replaces_it_after_the_budget(
    tmp_path: Path,
) -> None:
    fleet = _fleet(tmp_path)
    rec = PodRecord(name="fr-ondemand-0-g0", tier="ondemand", slot=0, gen=0, spot=False,
                    state="running", provider_id="p", ready=True, ready_since=900.0)  # fmt: skip
    unready = Probe(alive=True, ready=False, error=f"worker not ready: HTTP 503: {REASON}")
    fleet._apply_probe(rec, unready, 1000.0)
    assert rec.ready is False and rec.fails == 1  # no longer placed: streams move this pass
    assert not fleet._unhealthy(rec, 1000.0)  # one failure: not yet replaced
    event = fleet.events[-1]
    assert event["kind"] == "unhealthy" and event["readyz_ok"] is False
    assert event["healthz_ok"] is True and REASON in str(event["error"])
    fleet._apply_probe(rec, unready, 1002.0)
    assert fleet._unhealthy(rec, 1002.0)  # unhealthy_after failures: replaced
    assert fleet.counters["unhealthy"] == 1


def test_a_heartbeat_without_readyz_answer_keeps_the_old_meaning(tmp_path: Path) -> None:
    """A prober that does not ask /readyz (ready None) fails a worker only by count."""
    fleet = _fleet(tmp_path)
    rec = PodRecord(name="fr-ondemand-0-g0", tier="ondemand", slot=0, gen=0, spot=False,
                    state="running", provider_id="p", ready=True, ready_since=900.0)  # fmt: skip
    fleet._apply_probe(rec, Probe(alive=False, error="heartbeat failed"), 1000.0)
    assert rec.ready is True and rec.fails == 1
    fleet._apply_probe(rec, Probe(alive=False, error="heartbeat failed"), 1002.0)
    assert rec.ready is False
