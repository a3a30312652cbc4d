"""A contract server for RunPod's serverless endpoint API (queue-based), for tests and benches.

It follows the documented operations at ``https://api.runpod.ai/v2/{endpoint_id}/...``
(RunPod docs, "Send API requests" and "Operation reference":
serverless/endpoints/send-requests, serverless/endpoints/operation-reference; job states:
serverless/endpoints/job-states):

- ``POST /run`` ``{"input": {...}, "policy"?: {...}, "webhook"?: ...}`` answers
  ``{"id", "status": "IN_QUEUE"}``; a body over 10 MB is refused (the docs give the
  limit, not the answer: 400 here). ``POST /runsync`` waits for the job (20 MB).
- ``GET /status/{id}``: ``IN_QUEUE`` -> ``IN_PROGRESS`` (or ``RUNNING``, as RunPod also
  documents it: :attr:`Faults.shown_as`) -> ``COMPLETED`` with ``output``,
  ``delayTime`` and ``executionTime`` (ms); ``FAILED`` with ``error``; ``CANCELLED``;
  ``TIMED_OUT`` (``policy.executionTimeout``, ms, default 600000, or a fault). A job is
  kept 30 minutes after it ends (``/run``), then 404.
- ``POST /cancel/{id}``, ``POST /retry/{id}`` (``FAILED``/``TIMED_OUT`` only),
  ``POST /purge-queue``, ``GET /health`` (``jobs``: completed, failed, inProgress,
  inQueue, retried; ``workers``: idle, running).
- The API key in ``Authorization`` (``Bearer <key>`` or the bare key, as the docs' curl
  examples show both); anything else is 401.

Jobs run *our* handler (:class:`gpu_worker.serverless.ServerlessHandler`, or any
``handler(job) -> output``) in a pool of worker threads, as RunPod runs the image's
handler: ``handler({"id": ..., "input": ...})``; a returned dict's ``"error"`` fails
the job with it, an exception fails it with the exception (the SDK's ``run_job``).
Workers start cold (``cold_start_s``) and scale back to zero after ``idle_timeout_s``.
Faults are injected by the test (:class:`Faults`).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from bench.rig.serving import serve_in_thread

Handler = Callable[[Mapping[str, Any]], Any]
RUN_MAX_BYTES = 10 * 1024 * 1024
RUNSYNC_MAX_BYTES = 20 * 1024 * 1024
RETENTION_S = 30 * 60.0
DEFAULT_EXECUTION_TIMEOUT_MS = 600_000
TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"})


@dataclass
class Faults:
    """Failures the next requests or jobs meet (each counter counts down)."""

    fail_next: int = 0
    """Answer the next N authenticated requests with HTTP 500 (nothing done)."""
    rate_limit_next: int = 0
    """Answer the next N with 429 (``Retry-After: 0.05``)."""
    lose_run_answer_next: int = 0
    """The next N ``/run`` are queued but answered 502 (the answer is lost on the way:
    a client that retries has submitted the job twice)."""
    crash_next_jobs: int = 0
    """The next N jobs fail as a worker that died would (``FAILED``, no output)."""
    time_out_next_jobs: int = 0
    """The next N jobs never report back: ``TIMED_OUT``."""
    job_delay_s: float = 0.0
    """Each job waits this long in the queue."""
    shown_as: dict[str, str] = field(default_factory=dict)
    """``/status`` shows a state under another name: RunPod documents both ``IN_PROGRESS``
    and ``RUNNING`` for a job on a worker (``{"IN_PROGRESS": "RUNNING"}``), and may add
    a state a client does not know yet."""


@dataclass
class Job:
    id: str
    input: dict[str, Any]
    execution_timeout_ms: int
    status: str = "IN_QUEUE"
    created: float = field(default_factory=time.monotonic)
    started: float | None = None
    ended: float | None = None
    output: Any = None
    error: str | None = None
    retries: int = 0
    done: threading.Event = field(default_factory=threading.Event)

    def view(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "status": self.status}
        if self.started is not None:
            out["delayTime"] = round((self.started - self.created) * 1000)
        if self.ended is not None and self.started is not None:
            out["executionTime"] = round((self.ended - self.started) * 1000)
        if self.status == "COMPLETED" and self.output is not None:
            out["output"] = self.output
        if self.error is not None:
            out["error"] = self.error
        return out


class EndpointState:
    """One serverless endpoint: its queue, jobs, workers and counters."""

    def __init__(
        self,
        api_key: str,
        handler: Handler,
        *,
        endpoint_id: str = "ep-contract",
        workers: int = 2,
        cold_start_s: float = 0.0,
        idle_timeout_s: float = 5.0,
        retention_s: float = RETENTION_S,
    ) -> None:
        self.api_key = api_key
        self.handler = handler
        self.endpoint_id = endpoint_id
        self.max_workers = workers
        self.cold_start_s = cold_start_s
        self.idle_timeout_s = idle_timeout_s
        self.retention_s = retention_s
        self.faults = Faults()
        self.jobs: dict[str, Job] = {}
        self.requests: list[tuple[str, str]] = []
        self.key_in_url = False
        self.counts = {"completed": 0, "failed": 0, "retried": 0}
        self.handler_calls = 0
        self.running = 0
        self.warm_until = 0.0
        self.cold_starts = 0
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="rp-worker")
        self._lock = threading.Lock()

    # --- queue -----------------------------------------------------------------------
    def submit(self, body: dict[str, Any]) -> Job:
        policy = body.get("policy") or {}
        timeout_ms = int(policy.get("executionTimeout", DEFAULT_EXECUTION_TIMEOUT_MS))
        job = Job(str(uuid.uuid4()) + "-u1", body["input"], timeout_ms)
        with self._lock:
            self.jobs[job.id] = job
        self._pool.submit(self._work, job)
        return job

    def retry(self, job: Job) -> None:
        with self._lock:
            job.status, job.output, job.error = "IN_QUEUE", None, None
            job.started = job.ended = None
            job.created, job.retries = time.monotonic(), job.retries + 1
            job.done.clear()
            self.counts["retried"] += 1
        self._pool.submit(self._work, job)

    def cancel(self, job: Job) -> None:
        with self._lock:
            if job.status not in TERMINAL:
                job.status, job.ended = "CANCELLED", time.monotonic()
                job.done.set()

    def purge(self) -> int:
        with self._lock:
            queued = [j for j in self.jobs.values() if j.status == "IN_QUEUE"]
            for j in queued:
                j.status, j.ended = "CANCELLED", time.monotonic()
                j.done.set()
        return len(queued)

    def get(self, job_id: str) -> Job | None:
        job = self.jobs.get(job_id)
        if job is not None and job.ended is not None:
            if time.monotonic() - job.ended > self.retention_s:
                return None
        return job

    # --- a worker ----------------------------------------------------------------------
    def _work(self, job: Job) -> None:
        if self.faults.job_delay_s:
            time.sleep(self.faults.job_delay_s)
        with self._lock:
            if job.status != "IN_QUEUE":
                return  # cancelled or purged while queued
            job.status, job.started = "IN_PROGRESS", time.monotonic()
            self.running += 1
            cold = time.monotonic() > self.warm_until
            self.cold_starts += cold
            crash = self._take("crash_next_jobs")
            hang = not crash and self._take("time_out_next_jobs")
        try:
            if cold and self.cold_start_s:
                time.sleep(self.cold_start_s)
            if crash:
                self._end(job, "FAILED", error="worker exited unexpectedly (contract fault)")
            elif hang:
                self._end(job, "TIMED_OUT", error="job timed out (contract fault)")
            else:
                self._run_handler(job)
        finally:
            with self._lock:
                self.running -= 1
                self.warm_until = time.monotonic() + self.idle_timeout_s

    def _take(self, name: str) -> bool:
        left = int(getattr(self.faults, name))
        if left > 0:
            setattr(self.faults, name, left - 1)
        return left > 0

    def _run_handler(self, job: Job) -> None:
        with self._lock:
            self.handler_calls += 1
        try:
            out = self.handler({"id": job.id, "input": job.input})
        except Exception as exc:
            self._end(job, "FAILED", error=json.dumps(
                {"error_type": str(type(exc)), "error_message": str(exc)}))  # fmt: skip
            return
        assert job.started is not None
        if (time.monotonic() - job.started) * 1000 > job.execution_timeout_ms:
            self._end(job, "TIMED_OUT", error="execution timeout exceeded")
        elif isinstance(out, dict) and out.get("error"):
            rest = {k: v for k, v in out.items() if k != "error"}
            self._end(job, "FAILED", error=str(out["error"]), output=rest or None)
        else:
            self._end(job, "COMPLETED", output=out)

    def _end(self, job: Job, status: str, *, error: str | None = None, output: Any = None) -> None:
        with self._lock:
            if job.status != "IN_PROGRESS":
                return  # cancelled meanwhile: its output is dropped
            job.status, job.ended, job.error, job.output = status, time.monotonic(), error, output
            key = "completed" if status == "COMPLETED" else "failed"
            self.counts[key] += 1
            job.done.set()

    # --- views -------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        with self._lock:
            states = [j.status for j in self.jobs.values()]
            warm = time.monotonic() <= self.warm_until or self.running > 0
            idle = max(self.max_workers - self.running, 0) if warm else 0
            return {
                "jobs": {**self.counts, "inProgress": states.count("IN_PROGRESS"),
                         "inQueue": states.count("IN_QUEUE")},
                "workers": {"idle": idle, "running": self.running},
            }  # fmt: skip

    def close(self) -> None:
        self.purge()
        self._pool.shutdown(wait=True, cancel_futures=True)


def _authorized(state: EndpointState, request: Request) -> bool:
    got = request.headers.get("Authorization", "")
    return got in (f"Bearer {state.api_key}", state.api_key)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _injected(state: EndpointState) -> JSONResponse | None:
    if state.faults.fail_next > 0:
        state.faults.fail_next -= 1
        return _error(500, "internal server error")
    if state.faults.rate_limit_next > 0:
        state.faults.rate_limit_next -= 1
        return _error(429, "too many requests", {"Retry-After": "0.05"})
    return None


async def _body(request: Request, limit: int) -> dict[str, Any] | JSONResponse:
    raw = await request.body()
    if len(raw) > limit:
        return _error(400, f"request body is {len(raw)} bytes; the limit is {limit}")
    try:
        body = json.loads(raw)
    except ValueError:
        return _error(400, "request body is not JSON")
    if not isinstance(body, dict) or not isinstance(body.get("input"), dict):
        return _error(400, 'the request needs a JSON object {"input": {...}}')
    return body


def create_app(state: EndpointState) -> FastAPI:  # noqa: C901 - one route table
    app = FastAPI(title="RunPod serverless endpoint API v2 (contract)")
    base = "/v2/{endpoint_id}"

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Any:
        state.requests.append((request.method, request.url.path))
        if state.api_key in str(request.url):
            state.key_in_url = True
        if not _authorized(state, request):
            return _error(401, "unauthorized")
        if request.url.path.split("/")[2:3] != [state.endpoint_id]:
            return _error(404, "endpoint not found")
        return _injected(state) or await call_next(request)

    @app.post(base + "/run")
    async def run(request: Request) -> Any:
        body = await _body(request, RUN_MAX_BYTES)
        if isinstance(body, JSONResponse):
            return body
        job = state.submit(body)
        if state._take("lose_run_answer_next"):
            return _error(502, "bad gateway")
        return {"id": job.id, "status": "IN_QUEUE"}

    @app.post(base + "/runsync")
    async def runsync(request: Request, wait: int = 90_000) -> Any:
        body = await _body(request, RUNSYNC_MAX_BYTES)
        if isinstance(body, JSONResponse):
            return body
        job = state.submit(body)
        waited = max(1000, min(wait, 300_000)) / 1000
        await _wait(job, waited)
        return job.view()

    @app.get(base + "/status/{job_id}")
    async def status(job_id: str) -> Any:
        job = state.get(job_id)
        if job is None:
            return _error(404, "job not found")
        view = job.view()
        view["status"] = state.faults.shown_as.get(view["status"], view["status"])
        return view

    @app.post(base + "/cancel/{job_id}")
    async def cancel(job_id: str) -> Any:
        job = state.get(job_id)
        if job is None:
            return _error(404, "job not found")
        state.cancel(job)
        return {"id": job.id, "status": job.status}

    @app.post(base + "/retry/{job_id}")
    async def retry(job_id: str) -> Any:
        job = state.get(job_id)
        if job is None:
            return _error(404, "job not found")
        if job.status not in ("FAILED", "TIMED_OUT"):
            return _error(400, f"only FAILED or TIMED_OUT jobs are retried, not {job.status}")
        state.retry(job)
        return {"id": job.id, "status": "IN_QUEUE"}

    @app.post(base + "/purge-queue")
    async def purge() -> Any:
        return {"removed": state.purge(), "status": "completed"}

    @app.get(base + "/health")
    async def health() -> Any:
        return state.health()

    return app


async def _wait(job: Job, timeout_s: float) -> None:
    await asyncio.to_thread(job.done.wait, timeout_s)


@contextmanager
def running_endpoint(state: EndpointState) -> Iterator[str]:
    """Serve on 127.0.0.1 (free port) in a thread; yields the API base URL (``.../v2``).
    The endpoint's URL is ``<base>/<state.endpoint_id>``."""
    try:
        with serve_in_thread(create_app(state), "serverless contract server") as port:
            yield f"http://127.0.0.1:{port}/v2"
    finally:
        state.close()
