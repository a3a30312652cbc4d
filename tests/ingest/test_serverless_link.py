"""The RunPod serverless client against the contract server (real sockets on 127.0.0.1).

The handler here is a plain function (no model): what is checked is the documented API
as the client uses it (``/run``, ``/status`` states, ``/cancel``, ``/health``, auth,
429/5xx retries, the 10 MB limit, deadlines) and that the key never leaves its header.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import pytest
from pydantic import SecretStr, ValidationError

from bench.rig.runpod_serverless_contract import EndpointState, running_endpoint
from framerelay.errors import ConfigError
from ingest.serverless_link import (
    JobFailed,
    ServerlessError,
    ServerlessLink,
    ServerlessSettings,
    ServerlessTimeout,
)
from tests.conftest import TIMEOUT_FACTOR

KEY = "rp_test_" + "k" * 24
ENDPOINT = "ep-contract"


class Echo:
    """A handler: echoes its input; ``gate`` holds jobs until set; ``error`` fails them."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.error: str | None = None
        self.raise_: bool = False

    def __call__(self, job: Mapping[str, Any]) -> Any:
        if not self.gate.wait(30):
            return {"error": "gate never opened"}
        if self.raise_:
            raise RuntimeError("handler blew up")
        if self.error is not None:
            return {"error": self.error}
        return {"echo": job["input"], "job": job["id"]}


@pytest.fixture
def handler() -> Echo:
    return Echo()


@pytest.fixture
def endpoint(handler: Echo) -> Iterator[tuple[EndpointState, str]]:
    state = EndpointState(KEY, handler, endpoint_id=ENDPOINT, workers=2)
    with running_endpoint(state) as url:
        yield state, url


def _settings(url: str, **over: Any) -> ServerlessSettings:
    base: dict[str, Any] = {
        "base_url": url, "api_key": SecretStr(KEY), "poll_initial_s": 0.02,
        "poll_max_s": 0.1, "backoff_s": 0.02, "job_deadline_s": 20 * TIMEOUT_FACTOR,
    }  # fmt: skip
    return ServerlessSettings(**{**base, **over})


async def _once(url: str, op: str, arg: Any, **over: Any) -> Any:
    """``link.<op>(arg)`` on a link that is closed afterwards."""
    async with asyncio.timeout(60 * TIMEOUT_FACTOR):
        async with ServerlessLink(_settings(url, **over), ENDPOINT) as link:
            return await getattr(link, op)(arg)


async def test_run_moves_through_the_documented_states(
    endpoint: tuple[EndpointState, str], handler: Echo
) -> None:
    state, url = endpoint
    handler.gate.clear()

    async with asyncio.timeout(60 * TIMEOUT_FACTOR):
        async with ServerlessLink(_settings(url), ENDPOINT) as link:
            job_id = await link.submit({"n": 1})
            seen = [(await link.status(job_id))["status"]]
            deadline = time.monotonic() + 10 * TIMEOUT_FACTOR
            while seen[-1] != "IN_PROGRESS" and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
                seen.append((await link.status(job_id))["status"])
            await asyncio.sleep(0.2)
            handler.gate.set()
            output = await link.wait(job_id)
            final = await link.status(job_id)
            seen.append(final["status"])
            assert final["executionTime"] >= 150 and final["delayTime"] >= 0
            assert link.execution_s == pytest.approx(final["executionTime"] / 1000)
    assert seen[0] in ("IN_QUEUE", "IN_PROGRESS")
    assert "IN_PROGRESS" in seen and seen[-1] == "COMPLETED"
    assert output["echo"] == {"n": 1}
    assert ("POST", f"/v2/{ENDPOINT}/run") in state.requests


async def test_retries_429_and_5xx_then_succeeds(endpoint: tuple[EndpointState, str]) -> None:
    state, url = endpoint
    state.faults.fail_next = 2
    state.faults.rate_limit_next = 1

    async with asyncio.timeout(60 * TIMEOUT_FACTOR):
        async with ServerlessLink(_settings(url), ENDPOINT) as link:
            out = await link.run({"n": 2})
            retries = link.retries
    assert out["echo"] == {"n": 2}
    assert retries == 3


async def test_gives_up_after_max_retries(endpoint: tuple[EndpointState, str]) -> None:
    state, url = endpoint
    state.faults.fail_next = 10
    with pytest.raises(ServerlessError, match=r"HTTP 500 \(after 3 attempts\)"):
        await _once(url, "run", {"n": 3}, max_retries=2)


@pytest.mark.parametrize(
    ("setup", "status", "text"),
    [
        (lambda s, h: setattr(h, "error", "bad frame"), "FAILED", "bad frame"),
        (lambda s, h: setattr(h, "raise_", True), "FAILED", "handler blew up"),
        (lambda s, h: setattr(s.faults, "crash_next_jobs", 1), "FAILED", "worker exited"),
        (lambda s, h: setattr(s.faults, "time_out_next_jobs", 1), "TIMED_OUT", "timed out"),
    ],
)
async def test_a_failed_job_raises_with_its_status(
    endpoint: tuple[EndpointState, str], handler: Echo, setup: Any, status: str, text: str
) -> None:
    state, url = endpoint
    setup(state, handler)
    with pytest.raises(JobFailed, match=text) as info:
        await _once(url, "run", {"n": 4})
    assert info.value.status == status


async def test_deadline_cancels_the_job(endpoint: tuple[EndpointState, str], handler: Echo) -> None:
    state, url = endpoint
    handler.gate.clear()
    with pytest.raises(ServerlessTimeout, match="cancelled"):
        await _once(url, "run", {"n": 5}, job_deadline_s=0.3)
    handler.gate.set()
    assert [p for m, p in state.requests if m == "POST" and "/cancel/" in p]
    (job,) = state.jobs.values()
    assert job.status == "CANCELLED"


async def test_wrong_key_is_refused_without_echoing_it(
    endpoint: tuple[EndpointState, str], caplog: pytest.LogCaptureFixture
) -> None:
    _, url = endpoint
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="ingest")
    wrong = "rp_wrong_" + "w" * 20
    with pytest.raises(ServerlessError, match=r"HTTP 401.*check the RunPod API key") as info:
        await _once(url, "run", {}, api_key=SecretStr(wrong))
    assert wrong not in str(info.value) and wrong not in caplog.text


async def test_key_travels_only_in_the_header(
    endpoint: tuple[EndpointState, str], caplog: pytest.LogCaptureFixture
) -> None:
    state, url = endpoint
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="ingest")
    state.faults.fail_next = 1  # a retry is logged
    await _once(url, "run", {"n": 6})
    assert not state.key_in_url
    assert KEY not in caplog.text
    assert "retrying" in caplog.text


def test_contract_takes_bearer_or_bare_key_and_refuses_others(
    endpoint: tuple[EndpointState, str],
) -> None:
    _, url = endpoint
    health = f"{url}/{ENDPOINT}/health"
    assert httpx.get(health, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert httpx.get(health, headers={"Authorization": KEY}).status_code == 200
    assert httpx.get(health, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert httpx.get(f"{url}/other/health", headers={"Authorization": KEY}).status_code == 404


async def test_run_body_over_10_mb(endpoint: tuple[EndpointState, str]) -> None:
    state, url = endpoint
    big = {"blob": "x" * (10 * 1024 * 1024)}
    with pytest.raises(ServerlessError, match="over RunPod's 10485760-byte limit"):
        await _once(url, "submit", big)
    assert not [p for _, p in state.requests if p.endswith("/run")]  # never sent
    async with httpx.AsyncClient(timeout=30) as http:
        resp = await http.post(
            f"{url}/{ENDPOINT}/run", json={"input": big}, headers={"Authorization": KEY}
        )
    assert resp.status_code == 400 and "limit" in resp.json()["error"]


async def test_health_counts_jobs_and_workers(endpoint: tuple[EndpointState, str]) -> None:
    state, url = endpoint
    state.faults.crash_next_jobs = 1

    async with asyncio.timeout(60 * TIMEOUT_FACTOR):
        async with ServerlessLink(_settings(url), ENDPOINT) as link:
            with pytest.raises(JobFailed):
                await link.run({"n": 7})
            await link.run({"n": 8})
            health = await link.health()
    jobs = health["jobs"]
    assert (jobs["completed"], jobs["failed"], jobs["inQueue"], jobs["inProgress"]) == (1, 1, 0, 0)
    assert health["workers"] == {"idle": 2, "running": 0}


async def test_status_of_an_unknown_job_is_an_error(endpoint: tuple[EndpointState, str]) -> None:
    _, url = endpoint
    with pytest.raises(ServerlessError, match="HTTP 404"):
        await _once(url, "status", "no-such-job")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://api.example.com/v2", "plain http"),
        ("https://user:pw@api.runpod.ai/v2", "credentials"),
        ("ftp://api.runpod.ai", "https://"),
    ],
)
def test_settings_refuse_unsafe_urls(url: str, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        ServerlessSettings(base_url=url, api_key=SecretStr(KEY))


def test_link_needs_a_key_and_a_clean_endpoint_id() -> None:
    with pytest.raises(ConfigError, match="API key"):
        ServerlessLink(ServerlessSettings(), ENDPOINT)
    with pytest.raises(ConfigError, match="endpoint id"):
        ServerlessLink(ServerlessSettings(api_key=SecretStr(KEY)), "ep/../x")


async def test_workers_start_cold_and_scale_back_to_zero(handler: Echo) -> None:
    """The contract's endpoint has no worker until a job comes (a cold start, inside the
    job's executionTime), keeps them idle for ``idle_timeout_s``, then has none again."""
    state = EndpointState(KEY, handler, endpoint_id=ENDPOINT, workers=2, cold_start_s=0.2,
                          idle_timeout_s=0.3)  # fmt: skip
    with running_endpoint(state) as url:
        async with asyncio.timeout(60 * TIMEOUT_FACTOR):
            async with ServerlessLink(_settings(url), ENDPOINT) as link:
                seen = [await link.health()]
                await link.run({"n": 9})
                seen.append(await link.health())
                await asyncio.sleep(0.5)
                seen.append(await link.health())
                await link.run({"n": 10})
                assert link.execution_s >= 0.4  # two cold starts of 0.2 s
                before, warm, after = seen
    assert before["workers"] == {"idle": 0, "running": 0}
    assert warm["workers"] == {"idle": 2, "running": 0}
    assert after["workers"] == {"idle": 0, "running": 0}
    assert state.cold_starts == 2
