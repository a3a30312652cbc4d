"""The job routes (real server on 127.0.0.1, real Redis) and ``framerelay jobs`` against
a real orchestrator process: scopes jobs:read/jobs:write, clear 4xx for bad jobs (NaN
fps, an unknown model, 1001 inputs, a missing file, no token), submit/status/list/
cancel, cancel removes the task streams; the CLI makes paths absolute, names the input
the orchestrator refused, and fails in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis import Redis

from deploy.api import create_app
from deploy.health import StatusProber
from deploy.ingest_link import NullIngestLink
from deploy.service import Orchestrator
from framerelay.auth import KeySet
from framerelay.commands.jobs import absolute, describe, progress_bar
from tests.conftest import ROOT, TIMEOUT_FACTOR, service_env
from tests.support.auth import ed_keys, mint
from tests.support.orchestrator import MODEL_REGISTRY, orch_settings, serving_here

pytestmark = pytest.mark.integration
NAN_BODY = '{"inputs": ["/x.mp4"], "fps": NaN}'


@asynccontextmanager
async def api(tmp_path: Path, keys: KeySet) -> AsyncIterator[tuple[Orchestrator, str]]:
    registry = tmp_path / "models.toml"
    registry.write_text(MODEL_REGISTRY)
    settings = orch_settings(tmp_path, keys, model_registry=registry)
    orch = Orchestrator(settings, prober=StatusProber(20), ingest=NullIngestLink())
    try:
        async with serving_here(create_app(orch)) as url:
            yield orch, url
    finally:
        await orch.store.clear()
        await orch.aclose()


async def test_jobs_are_scoped_validated_listed_and_cancelled(tmp_path: Path) -> None:
    clip = tmp_path / "seg.mp4"
    clip.write_bytes(b"")
    keys = ed_keys()
    write = {"Authorization": f"Bearer {mint(keys, ['jobs:write', 'jobs:read'], 'orchestrator')}"}
    fleet = {"Authorization": f"Bearer {mint(keys, ['fleet:write'], 'orchestrator')}"}
    good = {"id": "night-1", "inputs": [str(clip)], "model": "vehicles"}

    out: dict[str, Any] = {}
    async with api(tmp_path, keys) as (orch, url), httpx.AsyncClient(base_url=url) as http:
        out["no token"] = await http.post("/v1/jobs", json=good)
        out["fleet scope"] = await http.post("/v1/jobs", json=good, headers=fleet)
        raw = {**write, "content-type": "application/json"}
        out["nan"] = await http.post("/v1/jobs", content=NAN_BODY, headers=raw)
        out["unknown model"] = await http.post(
            "/v1/jobs", json={**good, "model": "vehicels"}, headers=write
        )
        out["1001"] = await http.post(
            "/v1/jobs", json={**good, "inputs": [str(clip)] * 1001}, headers=write
        )
        out["missing"] = await http.post(
            "/v1/jobs", json={**good, "inputs": [str(clip), "/nope/secret.mp4"]}, headers=write
        )
        out["ok"] = await http.post("/v1/jobs", json=good, headers=write)
        out["again"] = await http.post("/v1/jobs", json=good, headers=write)
        await orch.step()  # the driver starts the task: its stream
        out["streams"] = sorted(await orch.store.streams())
        out["get"] = await http.get("/v1/jobs/night-1", headers=write)
        out["list"] = await http.get("/v1/jobs", headers=write)
        out["limit"] = await http.get("/v1/jobs?limit=0", headers=write)
        out["404"] = await http.get("/v1/jobs/nope", headers=write)
        out["cancel"] = await http.delete("/v1/jobs/night-1", headers=write)
        out["after"] = sorted(await orch.store.streams())
        out["cancel again"] = await http.delete("/v1/jobs/night-1", headers=write)

    assert out["no token"].status_code == 401 and out["fleet scope"].status_code == 403
    (nan,) = out["nan"].json()["detail"]
    assert out["nan"].status_code == 422 and nan["loc"] == ["body", "fps"]
    (unknown,) = out["unknown model"].json()["detail"]
    assert unknown["type"] == "unknown_model" and "vehicels" not in out["unknown model"].text
    (many,) = out["1001"].json()["detail"]
    assert many["loc"] == ["body", "inputs"] and "1000" in many["msg"]
    (missing,) = out["missing"].json()["detail"]
    assert missing["loc"] == ["body", "inputs", 1] and "no such file" in missing["msg"]
    assert "secret" not in out["missing"].text  # where and why, never the input
    assert out["ok"].status_code == 201 and out["again"].status_code == 409
    job = out["get"].json()
    assert job["state"] == "running" and job["sidecars"] == [str(tmp_path / "seg.night-1.jsonl")]
    assert job["tasks"][0]["state"] == "running" and job["cost_usd"] == 0.0
    assert out["streams"] == ["job-night-1-0"]
    assert [j["id"] for j in out["list"].json()] == ["night-1"]
    assert out["limit"].status_code == 422
    assert out["404"].status_code == 404
    assert out["cancel"].json()["state"] == "cancelled" and out["after"] == []
    assert out["cancel again"].status_code == 409


# -- the CLI against a real orchestrator process -------------------------------------------


@pytest.fixture
def orchestrator(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    keys_file = tmp_path / "signing.jwks"
    keys_file.write_text(ed_keys().to_json())
    keys_file.chmod(0o600)
    prefix = f"test-jobs-cli-{os.getpid()}-{time.monotonic_ns()}:"
    env = service_env()
    env.update({
        "FRAMERELAY_SIGNING_KEYS_FILE": str(keys_file), "FRAMERELAY_ORCH_KEY_PREFIX": prefix,
        "FRAMERELAY_ORCH_CA_DIR": str(tmp_path / "ca"), "FRAMERELAY_ORCH_TICK_S": "0.2",
        "FRAMERELAY_ORCH_TIERS": json.dumps([{"name": "ondemand", "max_workers": 0}]),
    })  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "framerelay", "orchestrator", "--port", "0"],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    url = json.loads(proc.stdout.readline())["url"]
    try:
        yield url, {**env, "FRAMERELAY_ORCH_URL": url}
    finally:
        proc.terminate()
        proc.communicate(timeout=20 * TIMEOUT_FACTOR)
        redis = Redis()
        for key in redis.scan_iter(match=prefix + "*"):
            redis.delete(key)
        redis.close()


def cli(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "framerelay", "jobs", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=60 * TIMEOUT_FACTOR)  # fmt: skip


def test_the_jobs_cli_submits_follows_lists_and_cancels(
    orchestrator: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    _url, env = orchestrator
    (tmp_path / "seg.mp4").write_bytes(b"")
    sub = cli(env, tmp_path, "submit", "seg.mp4", "--model", "yolox_nano", "--id", "cli-1")
    assert sub.returncode == 0, sub.stderr
    assert sub.stdout.strip() == "submitted job cli-1: 1 task(s)"
    status = cli(env, tmp_path, "status", "cli-1", "--json")
    job = json.loads(status.stdout)
    assert job["tasks"] and job["sidecars"] == [str(tmp_path / "seg.cli-1.jsonl")]  # absolute
    listed = cli(env, tmp_path, "list")
    assert "cli-1" in listed.stdout and "JOB" in listed.stdout
    cancelled = cli(env, tmp_path, "cancel", "cli-1")
    assert cancelled.stdout.strip() == "cancelled job cli-1"
    follow = cli(env, tmp_path, "status", "cli-1", "--wait")
    assert follow.returncode == 1 and "cancelled" in follow.stderr  # the bar, then the end
    assert "job cli-1: cancelled" in follow.stdout
    missing = cli(env, tmp_path, "submit", "seg.mp4", "gone.mp4", "--model", "yolox_nano")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "input 'gone.mp4'" in missing.stderr and "no such file" in missing.stderr
    nan = cli(env, tmp_path, "submit", "seg.mp4", "--model", "m", "--fps", "nan")
    assert nan.returncode == 2 and "finite" in nan.stderr
    no_token = {k: v for k, v in env.items() if k != "FRAMERELAY_SIGNING_KEYS_FILE"}
    refused = cli(no_token, tmp_path, "list")
    assert refused.returncode == 2 and "HTTP 401" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_the_progress_bar_and_the_summary_say_frames_eta_cost_and_duration() -> None:
    job = {"id": "n1", "state": "running", "frames_done": 45, "frames_total": 180,
           "eta_s": 75.4, "cost_usd": 0.00123, "duration_s": 12.0, "error": None,
           "tasks": [{"state": "done", "frames_done": 45, "frames_total": 60},
                     {"state": "pending", "frames_done": 0, "frames_total": None}],
           "sidecars": ["/r/a.n1.jsonl", "/r/b.n1.jsonl"]}  # fmt: skip
    bar = progress_bar(job)
    assert bar == "[#######.......................] 45/180 frames  eta 1m15s  $0.0012  running"
    assert progress_bar({**job, "frames_total": None}).startswith("[" + "." * 30 + "] 45/? ")
    text = describe(job)
    assert "eta: 1m15s" in text and "cost: $0.0012" in text and "duration: 12s" in text
    assert "task 1: pending 0/? -> /r/b.n1.jsonl" in text
    assert absolute("rtsp://cam/x") == "rtsp://cam/x" and absolute("a.mp4").startswith("/")
