"""Every job state RunPod documents, an endpoint's own request URLs, and a batch submitted
again only once its earlier job is cancelled: the serverless client against the contract
server (real sockets on 127.0.0.1), with a plain handler (no model).

RunPod's job states (serverless/endpoints/job-states): ``IN_QUEUE``, ``IN_PROGRESS`` and
``RUNNING`` (a worker has the job: both are documented), ``COMPLETED``, ``FAILED``,
``CANCELLED``, ``TIMED_OUT``. A state not in that list is logged and polled on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from pydantic import SecretStr

from bench.rig.runpod_serverless_contract import EndpointState, running_endpoint
from framerelay import wire
from framerelay.errors import ConfigError
from framerelay.geometry import Letterbox
from framerelay.jobs import EndpointUrls, JobTask
from ingest.prepare import Prepared
from ingest.serverless_link import JobFailed, ServerlessError, ServerlessLink, ServerlessSettings
from ingest.serverless_sink import FrameResult, ServerlessSink, SinkFrame
from ingest.serverless_task import ServerlessRuns
from ingest.settings import StreamConfig
from tests.conftest import TIMEOUT_FACTOR
from tests.support.waiting import wait_until_async

KEY = "rp_states_" + "s" * 24
ENDPOINT = "ep-states"


class Gated:
    """A handler answering one box per frame, holding each job until ``gate`` is set."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.error: str | None = None

    def __call__(self, job: Mapping[str, Any]) -> Any:
        if not self.gate.wait(30 * TIMEOUT_FACTOR):
            return {"error": "gate never opened"}
        if self.error is not None:
            return {"error": self.error}
        frames = job["input"].get("frames", [])
        results = [
            {"pts": f["pts"], "xyxy": [[1.0, 2.0, 3.0, 4.0]], "confidence": [0.9], "class_id": [0]}
            for f in frames
        ]
        return {"model": "m", "worker_id": "w1", "class_names": ["person"], "results": results}


@pytest.fixture
def handler() -> Gated:
    return Gated()


@pytest.fixture
def endpoint(handler: Gated) -> Iterator[tuple[EndpointState, str]]:
    state = EndpointState(KEY, handler, endpoint_id=ENDPOINT, workers=2)
    with running_endpoint(state) as url:
        yield state, url


def _settings(url: str, **over: Any) -> ServerlessSettings:
    base: dict[str, Any] = {
        "base_url": url,
        "api_key": SecretStr(KEY),
        "poll_initial_s": 0.02,
        "poll_max_s": 0.05,
        "backoff_s": 0.02,
        "max_retries": 1,
        "job_deadline_s": 20 * TIMEOUT_FACTOR,
    }
    return ServerlessSettings(**{**base, **over})


def _urls(base: str, template: bool) -> EndpointUrls:
    """Request URLs as RunPod's answer gives them: ``{job_id}`` in status and cancel (its
    documentation's examples) or the bare operation (the contract server's)."""
    job = "/{job_id}" if template else ""
    return EndpointUrls(
        run=f"{base}/run",
        status=f"{base}/status{job}",
        cancel=f"{base}/cancel{job}",
        health=f"{base}/health",
    )


@pytest.mark.parametrize(
    ("shown", "seen"),
    [
        ({}, {"IN_PROGRESS"}),
        ({"IN_PROGRESS": "RUNNING"}, {"RUNNING"}),
        ({"IN_QUEUE": "IN_QUEUE", "IN_PROGRESS": "RUNNING"}, {"IN_QUEUE", "RUNNING"}),
    ],
)
async def test_queued_in_progress_and_running_are_polled_until_the_job_completes(
    endpoint: tuple[EndpointState, str], handler: Gated, shown: dict[str, str], seen: set[str]
) -> None:
    state, url = endpoint
    state.faults.shown_as = shown
    state.faults.job_delay_s = 0.1 if "IN_QUEUE" in seen else 0.0
    handler.gate.clear()

    async with asyncio.timeout(60 * TIMEOUT_FACTOR):
        async with ServerlessLink(_settings(url), ENDPOINT) as link:
            job = asyncio.create_task(link.run({"frames": [{"pts": 7}]}))
            await wait_until_async(lambda: state.handler_calls == 1, 10, "the job on a worker")
            await asyncio.sleep(0.15)  # a few polls while a worker has it
            handler.gate.set()
            output, states = await job, set(link.states)
    assert output["results"][0]["pts"] == 7
    assert seen <= states and "COMPLETED" in states
    assert states <= {"IN_QUEUE", "IN_PROGRESS", "RUNNING", "COMPLETED"}


async def test_a_state_runpod_does_not_document_is_logged_once_and_polled_on(
    endpoint: tuple[EndpointState, str], handler: Gated, caplog: pytest.LogCaptureFixture
) -> None:
    state, url = endpoint
    state.faults.shown_as = {"IN_PROGRESS": "WARMING_UP"}
    handler.gate.clear()

    with caplog.at_level(logging.WARNING, logger="ingest.serverless_link"):
        async with asyncio.timeout(60 * TIMEOUT_FACTOR):
            async with ServerlessLink(_settings(url), ENDPOINT) as link:
                job = asyncio.create_task(link.run({"frames": [{"pts": 3}]}))
                await wait_until_async(lambda: state.handler_calls == 1, 10, "the job on a worker")
                await wait_until_async(
                    lambda: link.states["WARMING_UP"] >= 3, 10, "several polls of it"
                )
                handler.gate.set()
                output, polls = await job, link.states["WARMING_UP"]
    assert output["results"][0]["pts"] == 3 and polls >= 3
    said = [r.getMessage() for r in caplog.records if "WARMING_UP" in r.getMessage()]
    assert len(said) == 1 and "not one RunPod documents" in said[0], said
    assert KEY not in caplog.text


@pytest.mark.parametrize("end", ["FAILED", "TIMED_OUT", "CANCELLED"])
async def test_each_terminal_state_but_completed_fails_the_job_with_it(
    endpoint: tuple[EndpointState, str], handler: Gated, end: str
) -> None:
    state, url = endpoint
    if end == "FAILED":
        handler.error = "bad frames"
    elif end == "TIMED_OUT":
        state.faults.time_out_next_jobs = 1
    else:
        handler.gate.clear()

    with pytest.raises(JobFailed) as failed:
        async with asyncio.timeout(60 * TIMEOUT_FACTOR):
            async with ServerlessLink(_settings(url), ENDPOINT) as link:
                job = asyncio.create_task(link.run({"frames": []}))
                if end == "CANCELLED":  # cancelled by someone else (the console, a purge)
                    await wait_until_async(
                        lambda: state.handler_calls == 1, 10, "the job on a worker"
                    )
                    state.cancel(next(iter(state.jobs.values())))
                    handler.gate.set()
                await job
    assert failed.value.status == end


async def test_a_job_whose_status_cannot_be_read_is_cancelled_before_the_error_goes_on(
    endpoint: tuple[EndpointState, str], handler: Gated
) -> None:
    state, url = endpoint
    handler.gate.clear()

    with pytest.raises(ServerlessError, match="HTTP 500"):
        async with asyncio.timeout(60 * TIMEOUT_FACTOR):
            async with ServerlessLink(_settings(url), ENDPOINT) as link:
                running = asyncio.create_task(link.run({"frames": []}))
                await wait_until_async(lambda: state.handler_calls == 1, 10, "the job on a worker")
                state.faults.fail_next = 2  # /status answers 500 through the retries
                try:
                    await running
                finally:
                    handler.gate.set()
    (job,) = state.jobs.values()
    assert job.status == "CANCELLED"
    assert ("POST", f"/v2/{ENDPOINT}/cancel/{job.id}") in state.requests


def _frame(pts: int) -> SinkFrame:
    timing = wire.build(
        wire.Timing,
        stream_id="job-a-0",
        epoch=0,
        seq=pts,
        pts=pts,
        time_base=(1, 25),
        captured_at=1.0,
    )
    return SinkFrame(timing, Prepared(b"\xff" * 500, Letterbox.fit(640, 480, 416, 416)))


async def test_a_batch_is_submitted_again_only_after_its_earlier_job_is_cancelled(
    endpoint: tuple[EndpointState, str], handler: Gated
) -> None:
    state, url = endpoint
    handler.gate.clear()
    got: list[FrameResult] = []

    async def on_results(results: list[FrameResult]) -> None:
        got.extend(results)

    async with asyncio.timeout(60 * TIMEOUT_FACTOR):
        async with ServerlessLink(_settings(url), ENDPOINT) as link:
            sink = ServerlessSink(link, on_results, max_frames=2, attempts=2)
            await sink.put(_frame(0))
            await sink.put(_frame(1))
            await wait_until_async(
                lambda: state.handler_calls == 1, 10, "the first job on a worker"
            )
            state.faults.fail_next = 2  # its /status cannot be read: submitted again
            await wait_until_async(lambda: len(state.jobs) == 2, 10, "the batch submitted again")
            handler.gate.set()
            await sink.drain()
            resubmits = sink.resubmits
    first, second = state.jobs.values()
    calls = state.requests
    cancel = calls.index(("POST", f"/v2/{ENDPOINT}/cancel/{first.id}"))
    runs = [i for i, call in enumerate(calls) if call == ("POST", f"/v2/{ENDPOINT}/run")]
    assert resubmits == 1 and len(runs) == 2
    assert runs[0] < cancel < runs[1]  # cancelled, then submitted again
    assert (first.status, second.status) == ("CANCELLED", "COMPLETED")
    assert sorted(r.frame.timing.pts for r in got) == [0, 1]


@pytest.mark.parametrize("template", [True, False])
async def test_an_endpoints_own_request_urls_are_used_as_given(
    endpoint: tuple[EndpointState, str], template: bool
) -> None:
    state, url = endpoint
    urls = _urls(f"{url}/{ENDPOINT}", template)

    async with asyncio.timeout(60 * TIMEOUT_FACTOR):
        # an id that is not the endpoint's: only the URLs can have led there
        async with ServerlessLink(_settings(url), "not-its-id", urls=urls) as link:
            output, health = await link.run({"frames": [{"pts": 1}]}), await link.health()
    assert output["results"][0]["pts"] == 1 and health["jobs"]["completed"] == 1
    (job,) = state.jobs.values()
    assert ("GET", f"/v2/{ENDPOINT}/status/{job.id}") in state.requests
    assert not state.key_in_url


@pytest.mark.parametrize(
    "elsewhere",
    [
        "http://127.0.0.2:{port}/v2/ep",  # another host
        "http://127.0.0.1:{other}/v2/ep",  # another port
        "https://127.0.0.1:{port}/v2/ep",  # another scheme
        "http://example.com/v2/ep",  # plain http off this host
    ],
)
def test_request_urls_off_the_configured_api_are_refused(elsewhere: str) -> None:
    """The RunPod key goes only to the origin the ingest's base_url names."""
    settings = _settings("http://127.0.0.1:8123/v2")
    urls = _urls(elsewhere.format(port=8123, other=8124), template=True)
    with pytest.raises(ConfigError, match="its run URL is"):
        ServerlessLink(settings, "ep", urls=urls)
    task = JobTask(
        job_id="jj",
        index=0,
        sidecar="/r/a.jsonl",
        serverless_endpoint_id="ep",
        serverless_urls=urls,
    )
    config = StreamConfig(id="job-jj-0", url="/r/a.mp4", realtime=False, fps=0, job=task)
    runs = ServerlessRuns(settings, lambda record: None)
    with pytest.raises(ConfigError, match="serverless endpoint ep: its run URL is"):
        runs.check(config)  # refused when the orchestrator gives the task
