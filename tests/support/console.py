"""What the console's tests share: an orchestrator for its panels (no pods, or jobs put in its
store), an app served on a given port with its requests counted, and a real ingest API
with one stream beside a browser signed in to the console."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request, Response

from deploy.clock import Clock
from deploy.health import StatusProber
from deploy.ingest_link import NullIngestLink
from deploy.jobs import JobRecord, TaskRecord
from deploy.service import Orchestrator
from framerelay.auth import KeySet
from framerelay.data import DEFAULT_CLIP
from framerelay.jobs import JobSpec, TaskProgress, progress_key
from tests.conftest import TIMEOUT_FACTOR
from tests.support.auth import ed_keys
from tests.support.ingest_api import Ingest, running_ingest
from tests.support.orchestrator import orch_settings
from tests.support.waiting import wait_until_async


def counted(app: FastAPI) -> collections.Counter[str]:
    """The requests ``app`` receives, by path."""
    calls: collections.Counter[str] = collections.Counter()

    @app.middleware("http")
    async def count(request: Request, call_next: Any) -> Response:
        calls[request.url.path] += 1
        response: Response = await call_next(request)
        return response

    return calls


@asynccontextmanager
async def plain_orchestrator(
    tmp_path: Path, keys: KeySet, clock: Clock | None = None
) -> AsyncIterator[Orchestrator]:
    """An orchestrator with no pods (tiers of 0 workers), not served yet; on ``clock`` when
    one is given (the system's otherwise)."""
    orch = Orchestrator(
        orch_settings(tmp_path, keys), prober=StatusProber(20), ingest=NullIngestLink(), clock=clock
    )
    try:
        yield orch
    finally:
        await orch.store.clear()
        await orch.aclose()


@asynccontextmanager
async def served_on(app: FastAPI, port: int) -> AsyncIterator[None]:
    """Serve ``app`` on 127.0.0.1:``port`` until the block ends."""
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        await wait_until_async(lambda: server.started, 10, "orchestrator API up")
        yield
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


HOSTILE = '<img src=x onerror="window.pwned=1">&amp; "quoted" </td></tr>'
"""A job's error (ids and model names cannot hold HTML-special characters; errors can)."""


def _tasks(n: int, states: list[str]) -> list[TaskRecord]:
    return [
        TaskRecord(input=f"/rec/seg-{k}.mp4", sidecar=f"/rec/seg-{k}.jsonl", state=states[k])
        for k in range(n)
    ]


async def put_jobs(orch: Orchestrator) -> None:
    """A running job (3 segments of 300 frames: one done, one half way, one pending), a
    finished one with its final cost, a failed one whose error holds HTML and, newest, a
    queued one whose inputs are not open yet (no totals)."""
    now = orch.fleet.clock.now()
    spec = JobSpec(inputs=[f"/rec/seg-{k}.mp4" for k in range(3)], model="yolox-nano")
    jobs = [
        JobRecord(
            id="night-2",
            spec=spec,
            state="running",
            tasks=_tasks(3, ["done", "running", "pending"]),
            submitted_at=now - 130,
            started_at=now - 120,
            cost_usd=0.0123456,
            rate=[(now - 20, 250), (now, 450)],
        ),
        JobRecord(
            id="night-1",
            spec=spec,
            state="done",
            tasks=_tasks(3, ["done"] * 3),
            submitted_at=now - 4000,
            started_at=now - 3900,
            finished_at=now - 3000,
            cost_usd=0.4321,
        ),
        JobRecord(
            id="bad-1",
            spec=spec.model_copy(update={"inputs": spec.inputs[:1]}),
            state="failed",
            tasks=_tasks(1, ["failed"]),
            submitted_at=now - 5000,
            started_at=now - 4990,
            finished_at=now - 4980,
            error=HOSTILE,
            cost_usd=0.001,
        ),
        JobRecord(id="later-1", spec=spec, tasks=_tasks(3, ["pending"] * 3), submitted_at=now - 1),
    ]
    progress = {
        ("night-2", 0): TaskProgress(state="done", frames_done=300, frames_total=300),
        ("night-2", 1): TaskProgress(state="running", frames_done=150, frames_total=300),
        ("night-2", 2): TaskProgress(state="pending", frames_done=0, frames_total=300),
        ("night-1", 0): TaskProgress(state="done", frames_done=300, frames_total=300),
        ("night-1", 1): TaskProgress(state="done", frames_done=300, frames_total=300),
        ("night-1", 2): TaskProgress(state="done", frames_done=300, frames_total=300),
        ("bad-1", 0): TaskProgress(
            state="failed", frames_done=10, frames_total=300, error="the input cannot be decoded"
        ),
    }
    for rec in sorted(jobs, key=lambda r: r.submitted_at):
        assert await orch.jobs.submit(rec)
    for (job_id, k), said in progress.items():
        key = progress_key(orch.jobs.progress_prefix, job_id, k)
        await orch.jobs.progress_redis.set(key, said.model_dump_json())


async def run_with_ingest(tmp_path: Path, check: Any) -> None:
    """``check(ingest)`` in a thread (Selenium is synchronous) beside a real ingest API
    holding one stream."""
    async with running_ingest(ed_keys(), tmp_path) as ingest:
        body = {"id": "cam-1", "url": str(DEFAULT_CLIP), "realtime": True, "loop": True}
        async with httpx.AsyncClient(base_url=ingest.base) as http:
            r = await http.post("/v1/streams", json=body, headers=ingest.auth("streams:write"))
            assert r.status_code == 201, r.text
        await asyncio.to_thread(check, ingest)


def sign_in(driver: Any, ingest: Ingest, token: str) -> None:
    open_login(driver, ingest)
    enter_token(driver, token)


def open_login(driver: Any, ingest: Ingest) -> None:
    """The console, until its login form shows."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(ingest.base + "/console")
    WebDriverWait(driver, 30 * TIMEOUT_FACTOR).until(
        lambda d: d.find_element(By.ID, "login").is_displayed()
    )


def enter_token(driver: Any, token: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#login-form button[type=submit]").click()
