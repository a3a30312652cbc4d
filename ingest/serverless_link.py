"""A client for a RunPod serverless endpoint: submit with ``/run``, poll ``/status``.

Follows RunPod's documented queue-based endpoint API (docs: "Send API requests",
serverless/endpoints/send-requests; "Operation reference",
serverless/endpoints/operation-reference): ``POST {base}/{endpoint}/run`` with
``{"input": ..., "policy": {"executionTimeout": ms}}`` answers ``{"id", "status":
"IN_QUEUE"}``; ``GET .../status/{id}`` answers the job's state; ``POST .../cancel/{id}``
stops it; ``GET .../health`` counts jobs and workers. Base URL
``https://api.runpod.ai/v2``; a ``/run`` body is at most 10 MB (checked here before
sending); results are kept 30 minutes. An endpoint the orchestrator manages comes with
its own request URLs (:class:`framerelay.jobs.EndpointUrls`, RunPod's ``requestUrls``):
they are used as given, and only on the origin (scheme, host, port) of ``base_url``,
so the key never goes where the operator did not say RunPod is.

**Job states** (serverless/endpoints/job-states): ``IN_QUEUE`` (waiting for a worker),
``IN_PROGRESS`` and ``RUNNING`` (a worker has it: RunPod documents both) are polled on;
``COMPLETED`` (with ``output``), ``FAILED`` (with ``error``), ``CANCELLED`` and
``TIMED_OUT`` end it. A state RunPod may add later is logged once and polled on until
the job's deadline.

- The API key travels only in the ``Authorization: Bearer`` header: never in a URL, a
  log line or an error.
- 429, 5xx and transport errors are retried with capped exponential backoff and jitter
  (``Retry-After`` honoured); other 4xx stop at once (:class:`ServerlessError`). A
  retried ``/run`` whose first answer was lost may have queued the job twice: callers
  write results by a frame-fixed id, so a duplicate changes nothing.
- Polling backs off from ``poll_initial_s`` to ``poll_max_s``; past the job's deadline
  the job is cancelled and :class:`ServerlessTimeout` raised. Whenever waiting ends
  before the job did (a deadline, the endpoint unreachable through the retries, a
  stop), the job is cancelled first: a batch submitted again never runs beside its
  earlier job.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from framerelay.backoff import Backoff
from framerelay.errors import ConfigError, FramerelayError
from framerelay.jobs import EndpointUrls
from framerelay.net import describe_http_error, is_loopback

log = logging.getLogger(__name__)
RUNPOD_SERVERLESS_URL = "https://api.runpod.ai/v2"
RUN_MAX_BYTES = 10 * 1024 * 1024
"""RunPod's largest ``/run`` body (operation reference)."""
MAX_ANSWER_BYTES = 64 * 1024 * 1024
JobStatus = Literal[
    "IN_QUEUE", "IN_PROGRESS", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"
]
WAITING = frozenset({"IN_QUEUE", "IN_PROGRESS", "RUNNING"})
"""States of a job that has not ended: queued, or on a worker (IN_PROGRESS or RUNNING)."""
TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"})
_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_MAX_RETRY_AFTER_S = 30.0


class ServerlessError(FramerelayError):
    """The endpoint refused a request or could not be reached within the retries."""


class JobFailed(ServerlessError):
    """A job ended ``FAILED``, ``CANCELLED`` or ``TIMED_OUT`` (``status``)."""

    def __init__(self, job_id: str, status: str, error: str) -> None:
        super().__init__(f"serverless job {job_id} ended {status}: {error}"[:400])
        self.job_id = job_id
        self.status = status


class ServerlessTimeout(ServerlessError):
    """A job did not end before its deadline (it was cancelled)."""


class ServerlessSettings(BaseModel):
    """How the ingest talks to RunPod serverless endpoints."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    base_url: str = Field(RUNPOD_SERVERLESS_URL, description="RunPod's endpoint API (v2).")
    api_key: SecretStr | None = Field(None, description="RunPod API key (Bearer header only).")
    request_timeout_s: float = Field(30.0, gt=0, le=600)
    max_retries: int = Field(4, ge=0, le=20, description="Retries of 429/5xx per request.")
    backoff_s: float = Field(0.5, gt=0, le=600, description="First retry delay; doubles.")
    poll_initial_s: float = Field(0.2, gt=0, le=60)
    poll_max_s: float = Field(5.0, gt=0, le=600)
    job_deadline_s: float = Field(
        900.0, gt=0, le=86_400, description="Give a job up (and cancel it) after this long."
    )
    execution_timeout_s: float = Field(
        600.0, gt=5, le=86_400, description="The job's policy.executionTimeout (RunPod: > 5 s)."
    )

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, v: str) -> str:
        problem = endpoint_url_problem(v)
        if problem is not None:
            raise ValueError(problem)
        return v.rstrip("/")


def same_origin_problem(url: str, base_url: str) -> str | None:
    """Why the RunPod key may not go to ``url``, an endpoint's request URL (None: it may):
    it must be a URL the key may travel to, on the origin of ``base_url``."""
    problem = endpoint_url_problem(url)
    if problem is not None:
        return problem
    got, want = httpx.URL(url), httpx.URL(base_url)
    if (got.scheme, got.host, got.port) != (want.scheme, want.host, want.port):
        return (
            f"not on {want.scheme}://{want.netloc.decode()} (the RunPod endpoint API set in "
            "FRAMERELAY_INGEST_SERVERLESS__BASE_URL): the key goes nowhere else"
        )
    return None


def endpoint_url_problem(url: str) -> str | None:
    """Why ``url`` may not carry the API key (None: it may): https, or http to loopback."""
    try:
        parts = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return "not a valid URL; expected https://host[/path]"
    if parts.scheme not in ("http", "https") or not parts.host:
        return "must be https://host[/path] (http:// only to this host)"
    if parts.userinfo or parts.query or parts.fragment:
        return "must hold no credentials, query or fragment"
    if parts.scheme == "http" and not is_loopback(parts.host):
        return "refusing plain http:// off this host: the API key would cross unencrypted"
    return None


def endpoint_urls(
    settings: ServerlessSettings, endpoint_id: str, urls: EndpointUrls | None
) -> EndpointUrls:
    """The endpoint's request URLs: as given (each checked to be on ``base_url``'s
    origin; ConfigError otherwise), else ``base_url``/``endpoint_id``'s."""
    if urls is None:
        base = f"{settings.base_url}/{endpoint_id}"
        return EndpointUrls(
            run=f"{base}/run",
            status=f"{base}/status",
            cancel=f"{base}/cancel",
            health=f"{base}/health",
        )
    for name in ("run", "status", "cancel", "health"):
        problem = same_origin_problem(getattr(urls, name), settings.base_url)
        if problem is not None:
            raise ConfigError(f"serverless endpoint {endpoint_id}: its {name} URL is {problem}")
    return urls


class ServerlessLink:
    """One endpoint's jobs (see the module). Use as ``async with``."""

    def __init__(
        self,
        settings: ServerlessSettings,
        endpoint_id: str,
        *,
        urls: EndpointUrls | None = None,
        clock: Any = time.monotonic,
    ) -> None:
        if settings.api_key is None:
            raise ConfigError("serverless mode needs the RunPod API key (api_key)")
        if not endpoint_id.replace("-", "").replace("_", "").isalnum() or len(endpoint_id) > 100:
            raise ConfigError("serverless endpoint id: letters, digits, '-' and '_' only")
        self.settings = settings
        self.endpoint_id = endpoint_id
        self.urls = endpoint_urls(settings, endpoint_id, urls)
        self._clock = clock
        self._http = httpx.AsyncClient(
            headers={
                "Authorization": f"Bearer {settings.api_key.get_secret_value()}",
                "Accept": "application/json",
            },
            timeout=settings.request_timeout_s,
            follow_redirects=False,
            trust_env=False,
        )
        self.requests = 0
        self.retries = 0
        self.execution_s = 0.0
        """Worker time of the jobs this link saw end (``executionTime``): what RunPod bills."""
        self.states: Counter[str] = Counter()
        """Every state ``/status`` answered, counted (a state new to this client too)."""
        self.cancels = 0
        """Jobs this link cancelled (waiting ended before the job did)."""

    async def __aenter__(self) -> ServerlessLink:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # --- operations -----------------------------------------------------------------
    async def submit(self, job_input: dict[str, Any]) -> str:
        """Queue a job (``POST /run``); its id."""
        policy = {"executionTimeout": int(self.settings.execution_timeout_s * 1000)}
        body = json.dumps({"input": job_input, "policy": policy}, separators=(",", ":"))
        if len(body) > RUN_MAX_BYTES:
            raise ServerlessError(
                f"a /run body of {len(body)} bytes is over RunPod's {RUN_MAX_BYTES}-byte limit"
            )
        answer = await self._call("POST", self.urls.run, "/run", content=body.encode())
        job_id = answer.get("id") if isinstance(answer, dict) else None
        if not isinstance(job_id, str) or not job_id or len(job_id) > 200:
            raise ServerlessError("the endpoint's /run answer has no job id")
        return job_id

    async def status(self, job_id: str) -> dict[str, Any]:
        """The job's ``/status`` answer, its ``status`` a string (any state: see
        :meth:`wait` for what each means)."""
        url = self.urls.for_job(self.urls.status, _checked_id(job_id))
        answer = await self._call("GET", url, "/status")
        state = answer.get("status") if isinstance(answer, dict) else None
        if not isinstance(state, str) or not state or len(state) > 40:
            raise ServerlessError(f"the endpoint's /status of job {job_id} has no status")
        return dict(answer)

    async def cancel(self, job_id: str) -> None:
        """Cancel the job (best effort: a failure is logged, never raised)."""
        self.cancels += 1
        try:
            url = self.urls.for_job(self.urls.cancel, _checked_id(job_id))
            await self._call("POST", url, "/cancel")
        except ServerlessError as exc:
            log.warning("could not cancel serverless job %s: %s", job_id, exc)

    async def health(self) -> dict[str, Any]:
        answer = await self._call("GET", self.urls.health, "/health")
        if not isinstance(answer, dict):
            raise ServerlessError("the endpoint's /health answer is not an object")
        return answer

    async def run(self, job_input: dict[str, Any]) -> Any:
        """Submit and wait: the job's ``output``. :class:`JobFailed` when it fails,
        :class:`ServerlessTimeout` (after cancelling it) past ``job_deadline_s``."""
        job_id = await self.submit(job_input)
        return await self.wait(job_id)

    async def wait(self, job_id: str) -> Any:
        """Poll ``job_id`` until it ends (see :meth:`run`). Queued, ``IN_PROGRESS`` and
        ``RUNNING`` are polled on, a state unknown here too (logged once). Whenever this
        ends before the job did (a deadline, an error, a cancelled task) the job is
        cancelled on the endpoint before the exception goes on."""
        ended = False
        try:
            answer = await self._until_ended(job_id)
            ended = True
        finally:
            if not ended:
                await asyncio.shield(self.cancel(job_id))
        state = answer["status"]
        self.execution_s += _ms(answer.get("executionTime")) / 1000
        if state != "COMPLETED":
            raise JobFailed(job_id, state, _text(answer.get("error")) or "no error given")
        return answer.get("output")

    async def _until_ended(self, job_id: str) -> dict[str, Any]:
        """Poll until a terminal state; ServerlessTimeout past the job's deadline."""
        deadline = self._clock() + self.settings.job_deadline_s
        poll = Backoff(
            self.settings.poll_initial_s,
            max(self.settings.poll_max_s, self.settings.poll_initial_s),
            factor=1.5,
            jitter=0.1,
        )
        while True:
            answer = await self.status(job_id)
            state = answer["status"]
            self.states[state] += 1
            if state in TERMINAL:
                return answer
            if state not in WAITING and self.states[state] == 1:
                log.warning(
                    "serverless job %s: state %r is not one RunPod documents; still "
                    "polling until it ends or its deadline",
                    job_id,
                    state[:40],
                )
            left = deadline - self._clock()
            if left <= 0:
                raise ServerlessTimeout(
                    f"serverless job {job_id} still {state[:40]} after "
                    f"{self.settings.job_deadline_s:g} s; cancelled"
                )
            await asyncio.sleep(min(poll.next_delay(), left))

    # --- one request, retried ---------------------------------------------------------
    async def _call(self, method: str, url: str, what: str, content: bytes | None = None) -> Any:
        """``method`` ``url``, retried; ``what`` names it in messages (never the URL's
        query: there is none, and never a header)."""
        backoff = Backoff(self.settings.backoff_s, max(self.settings.backoff_s, 30.0))
        for attempt in range(self.settings.max_retries + 1):
            self.requests += 1
            problem, retry_after = await self._once(method, url, what, content)
            if not isinstance(problem, _Retry):
                return problem
            if attempt == self.settings.max_retries:
                raise ServerlessError(
                    f"{method} {what}: {problem.reason} (after {attempt + 1} attempts)"
                )
            self.retries += 1
            delay = backoff.next_delay() if retry_after is None else retry_after
            log.info(
                "serverless %s %s: %s; retrying in %.2f s", method, what, problem.reason, delay
            )
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _once(
        self, method: str, url: str, what: str, content: bytes | None
    ) -> tuple[Any, float | None]:
        headers = {"Content-Type": "application/json"} if content is not None else None
        try:
            resp = await self._http.request(method, url, content=content, headers=headers)
        except httpx.HTTPError as exc:
            return _Retry(f"unreachable: {describe_http_error(exc)}"), None
        if resp.status_code in _RETRY_STATUS:
            return _Retry(f"HTTP {resp.status_code}"), _retry_after(resp)
        if len(resp.content) > MAX_ANSWER_BYTES:
            raise ServerlessError(f"{method} {what}: answer over {MAX_ANSWER_BYTES} bytes")
        if resp.status_code >= 400:
            raise ServerlessError(
                f"{method} {what}: HTTP {resp.status_code}: {_error_of(resp)}"
                + (" (check the RunPod API key)" if resp.status_code in (401, 403) else "")
            )
        try:
            return resp.json(), None
        except ValueError:
            raise ServerlessError(f"{method} {what}: the answer is not JSON") from None


class _Retry:
    def __init__(self, reason: str) -> None:
        self.reason = reason


def _checked_id(job_id: str) -> str:
    if not job_id or len(job_id) > 200 or not all(c.isalnum() or c in "-_" for c in job_id):
        raise ServerlessError(f"not a job id: {job_id[:40]!r}")
    return job_id


def _retry_after(resp: httpx.Response) -> float | None:
    try:
        value = float(resp.headers.get("Retry-After", ""))
    except ValueError:
        return None
    return min(max(value, 0.0), _MAX_RETRY_AFTER_S) if value == value else None


def _ms(value: object) -> float:
    """A duration in ms from an answer (0 when missing or not a sane number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value) if 0 <= value < 1e10 else 0.0


def _text(value: object) -> str:
    return value if isinstance(value, str) else "" if value is None else json.dumps(value)[:300]


def _error_of(resp: httpx.Response) -> str:
    """The server's error text, truncated (never a request header)."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip()[:200]
    if isinstance(body, dict):
        return _text(body.get("error") or body.get("message") or body)[:200]
    return _text(body)[:200]
