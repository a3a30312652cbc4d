"""Issue 18: the console's jobs panel (GET /v1/console/jobs) of a real ingest API reading a
real orchestrator API on loopback (real Redis, the real job store): a running job's frames
done/total, %, ETA and cost so far, a finished job's final cost, a failed job's error as one
line; one upstream call per 2 s for any number of consoles; an orchestrator that is not
configured, unreachable (last rows kept, stale), refusing a token without jobs:read, or
answering what the ingest cannot read (NaN, huge numbers)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Response

from deploy.api import create_app as orch_app
from deploy.clock import FakeClock
from ingest.console_jobs import REFRESH_S
from tests.support.auth import ed_keys, mint
from tests.support.console import HOSTILE, counted, plain_orchestrator, put_jobs, served_on
from tests.support.ingest_api import client, running_ingest
from tests.support.orchestrator import serving_here
from tests.support.servers import free_port

pytestmark = pytest.mark.integration
PANEL = "/v1/console/jobs"
AFTER_REFRESH_S = REFRESH_S + 0.2


async def panel(http: httpx.AsyncClient, headers: dict[str, str]) -> dict[str, Any]:
    resp = await http.get(PANEL, headers=headers)
    assert resp.status_code == 200, resp.text
    assert resp.headers["cache-control"] == "no-store"
    body: dict[str, Any] = resp.json()
    return body


async def test_rows_show_progress_eta_cost_duration_and_tasks_of_the_orchestrators_jobs(
    tmp_path: Path,
) -> None:
    """The orchestrator on a fake clock: its "now" when the jobs are stored is its "now"
    when they are read, so durations and ETAs are exact whatever the machine's speed."""

    keys = ed_keys()
    direct = {"Authorization": f"Bearer {mint(keys, ['jobs:read'], 'orchestrator')}"}
    async with plain_orchestrator(tmp_path, keys, FakeClock(round(time.time()))) as orch:
        await put_jobs(orch)
        async with (
            serving_here(orch_app(orch)) as url,
            running_ingest(keys, tmp_path, orchestrator_url=url) as ingest,  # mints tokens
            client(ingest) as http,
            httpx.AsyncClient(base_url=url) as orch_http,
        ):
            body = await panel(http, ingest.auth("streams:read"))
            truth = (await orch_http.get("/v1/jobs", headers=direct)).json()
    assert body["configured"] and body["error"] is None and not body["stale"]
    assert body["age_s"] < 2 and body["fetched_at"] is not None
    rows = {r["id"]: r for r in body["jobs"]}
    assert [r["id"] for r in body["jobs"]] == [j["id"] for j in truth] == [
        "later-1", "night-2", "night-1", "bad-1"]  # fmt: skip
    for job in truth:
        row = rows[job["id"]]
        print(f"\n  {row}")
        assert (row["state"], row["frames_done"], row["frames_total"], row["eta_s"]) == (
            job["state"], job["frames_done"], job["frames_total"], job["eta_s"])  # fmt: skip
        assert (row["cost_usd"], row["duration_s"]) == (job["cost_usd"], job["duration_s"])
        assert row["model"] == "yolox-nano" and row["tasks_total"] == len(job["tasks"])
    running, done, failed, queued = (rows[i] for i in ("night-2", "night-1", "bad-1", "later-1"))
    assert (queued["state"], queued["frames_total"], queued["percent"]) == ("queued", None, None)
    assert (queued["duration_s"], queued["eta_s"], queued["tasks_done"]) == (None, None, 0)
    assert (running["frames_done"], running["frames_total"], running["percent"]) == (450, 900, 50.0)
    assert running["eta_s"] == 45.0  # 450 frames left at 200 frames in 20 s
    assert running["cost_usd"] == 0.012346 and not running["ended"]
    assert running["tasks_done"] == 1 and running["duration_s"] == 120.0  # started 120 s ago
    assert done["ended"] and done["cost_usd"] == 0.4321 and done["eta_s"] is None
    assert (done["percent"], done["tasks_done"], done["duration_s"]) == (100.0, 3, 900.0)
    assert failed["error"] == HOSTILE and failed["ended"] and failed["tasks_done"] == 0


async def test_one_upstream_call_per_refresh_whatever_the_number_of_consoles(
    tmp_path: Path,
) -> None:
    keys = ed_keys()
    async with plain_orchestrator(tmp_path, keys) as orch:
        await put_jobs(orch)
        app = orch_app(orch)
        calls = counted(app)
        async with (
            serving_here(app) as url,
            running_ingest(keys, tmp_path, orchestrator_url=url) as ingest,
            client(ingest) as http,
        ):
            read = ingest.auth("streams:read")
            bodies = await asyncio.gather(*(panel(http, read) for _ in range(20)))
            assert calls == {"/v1/jobs": 1}, calls
            await asyncio.gather(*(panel(http, read) for _ in range(10)))
            assert calls == {"/v1/jobs": 1}, calls
            await asyncio.sleep(AFTER_REFRESH_S)
            await asyncio.gather(*(panel(http, read) for _ in range(10)))
    assert calls == {"/v1/jobs": 2}, calls
    assert len({b["fetched_at"] for b in bodies}) == 1 and len(bodies[0]["jobs"]) == 4


async def test_not_configured_answers_so_and_the_route_needs_streams_read(tmp_path: Path) -> None:
    async with running_ingest(ed_keys(), tmp_path) as ingest, client(ingest) as http:
        assert await panel(http, ingest.auth("streams:read")) == {"configured": False}
        missing = await http.get(PANEL)
        wrong = await http.get(PANEL, headers=ingest.auth("results:*", "metrics:read"))
    assert missing.status_code == 401
    assert wrong.status_code == 403 and "streams:read" in wrong.text


async def test_an_unreachable_orchestrator_keeps_the_last_rows_marked_stale(tmp_path: Path) -> None:
    keys = ed_keys()
    async with plain_orchestrator(tmp_path, keys) as orch:
        await put_jobs(orch)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        async with running_ingest(keys, tmp_path, orchestrator_url=url) as ingest:
            async with client(ingest) as http:
                read = ingest.auth("streams:read")
                never = await panel(http, read)  # nobody listens yet
                await asyncio.sleep(AFTER_REFRESH_S)
                async with served_on(orch_app(orch), port):
                    good = await panel(http, read)
                await asyncio.sleep(AFTER_REFRESH_S)
                stale = await panel(http, read)
    assert never["jobs"] == [] and never["fetched_at"] is None and not never["stale"]
    assert never["error"] == "the orchestrator is unreachable: ConnectError"
    assert good["error"] is None and len(good["jobs"]) == 4
    assert stale["stale"] and stale["error"] == "the orchestrator is unreachable: ConnectError"
    assert stale["jobs"] == good["jobs"] and stale["fetched_at"] == good["fetched_at"]
    assert stale["age_s"] >= REFRESH_S


async def test_a_token_without_jobs_read_is_named_and_never_shown(tmp_path: Path) -> None:
    keys = ed_keys()
    token = mint(keys, ["fleet:read"], "orchestrator")  # enough for the fleet panel only
    async with plain_orchestrator(tmp_path, keys) as orch:
        async with (
            serving_here(orch_app(orch)) as url,
            running_ingest(
                keys, tmp_path, orchestrator_url=url, orchestrator_token=token
            ) as ingest,
            client(ingest) as http,
        ):
            read = ingest.auth("streams:read")
            jobs = await http.get(PANEL, headers=read)
            fleet = await http.get("/v1/console/fleet", headers=read)
    text, fleet = jobs.text, fleet.json()
    error = json.loads(text)["error"]
    print(f"\n  {error}")
    assert "HTTP 403" in error and "the ingest's token lacks jobs:read" in error
    assert "\n" not in error and token not in text and token.split(".")[2] not in text
    assert fleet["error"] is None  # the same token still reads the fleet


UNREADABLE = [
    (b'[{"id": "j", "state": "running", "cost_usd": NaN}]', "cost_usd"),
    (b'[{"id": "j", "state": "running", "frames_done": 1' + b"0" * 30 + b"}]", "frames_done"),
    (b'{"detail": "not a list"}', "the answer"),
]


@pytest.mark.parametrize(("answer", "where"), UNREADABLE)
async def test_an_answer_the_ingest_cannot_read_is_one_line(
    tmp_path: Path, answer: bytes, where: str
) -> None:
    odd = FastAPI()

    @odd.get("/v1/jobs")
    async def jobs() -> Response:
        return Response(answer, media_type="application/json")

    async with (
        serving_here(odd) as url,
        running_ingest(ed_keys(), tmp_path, orchestrator_url=url) as ingest,
        client(ingest) as http,
    ):
        body = await panel(http, ingest.auth("streams:read"))
    error = body["error"]
    assert error.startswith("the orchestrator's jobs are not what this ingest reads")
    assert where in error and "\n" not in error and body["jobs"] == []
