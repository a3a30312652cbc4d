"""Batch jobs on recordings (issue 18): the contract the orchestrator and the ingest share.

A *job* re-processes recorded video (the recorder's segments), files or URLs with a
model, at full speed, on the cheapest capacity its priority allows. The orchestrator
keeps the job (:class:`JobSpec` in, :class:`JobStatus` out) and runs each input as a
*task*: a batch stream ``job-<job>-<k>`` (:func:`task_stream_id`) whose spec carries a
:class:`JobTask`. The ingest that runs a task stream:

- reads the task's checkpoint (:func:`checkpoint_key`) and starts the input there;
- reads the input as fast as the worker answers (lossless, never paced);
- writes each result to the task's sidecar (:attr:`JobTask.sidecar`, the recorder's
  :class:`framerelay.schemas.SidecarLine` format) under an id that depends only on the
  frame (:func:`frame_result_id`), so a frame processed twice (a worker preempted after
  answering, before the checkpoint moved) is written once;
- moves the checkpoint to the last PTS below which every sampled frame is in the
  sidecar, and keeps :class:`TaskProgress` (:func:`progress_key`) current;
- after a worker is lost, starts over from the checkpoint (the frames that were in
  flight are sent again), and at the end of the input, once every frame is answered,
  marks the task done.

Redis keys live under ``<prefix>:job:<job id>:<k>:`` (prefix: the ingest's and the
orchestrator's shared ``redis_prefix``).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from framerelay.model_registry import BUILTIN_NAME, MODEL_NAME
from framerelay.results import ResultId

JOB_ID = r"^[a-z0-9][a-z0-9-]{0,30}[a-z0-9]$"
"""A job id: 2-32 lower-case letters, digits and '-' (it becomes part of stream ids)."""
MAX_INPUTS = 1000
JobState = Literal["queued", "running", "done", "failed", "cancelled"]
TaskState = Literal["pending", "running", "done", "failed"]
_JOB_ID = re.compile(JOB_ID)
_URL = r"^https?://[^\s]+$"


class EndpointUrls(BaseModel):
    """A queue-based RunPod serverless endpoint's request URLs, as RunPod's API v2 gives
    them (the endpoint's ``requestUrls``), never built from its id: ``run`` takes a job,
    ``status`` and ``cancel`` one job (a ``{job_id}`` in them stands for its id, else the
    id is appended), ``health`` the endpoint's queue and workers. The ingest sends the
    RunPod key only to URLs on the origin of its own setting of RunPod's endpoint API
    (``ingest.serverless_link``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run: str = Field(min_length=8, max_length=2000, pattern=_URL)
    status: str = Field(min_length=8, max_length=2000, pattern=_URL)
    cancel: str = Field(min_length=8, max_length=2000, pattern=_URL)
    health: str = Field(min_length=8, max_length=2000, pattern=_URL)

    def for_job(self, url: str, job_id: str) -> str:
        """``url`` (``status`` or ``cancel``) for one job."""
        if "{job_id}" in url:
            return url.replace("{job_id}", job_id)
        return f"{url.rstrip('/')}/{job_id}"


class JobTask(BaseModel):
    """What makes a stream a job's task: carried in the orchestrator's stream spec and the
    ingest's stream config (null for live streams)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    job_id: str = Field(pattern=JOB_ID)
    index: int = Field(ge=0, lt=MAX_INPUTS, description="The input's place in the job.")
    sidecar: str = Field(
        min_length=1, max_length=4096,
        description="Where the task's results are written (JSON Lines, one SidecarLine a "
        "frame), on a filesystem the ingest shares with the recordings.",
    )  # fmt: skip
    serverless_endpoint_id: str | None = Field(
        None, min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_-]+$",
        description="The task runs on this RunPod serverless endpoint (its tier's "
        "serverless_endpoint_id; the ingest posts the frames to its /run API, "
        "ingest.serverless_task) instead of on a worker over a tunnel; null: a tunnel.",
    )  # fmt: skip
    serverless_urls: EndpointUrls | None = Field(
        None,
        description="The endpoint's request URLs, as RunPod gave them to the orchestrator "
        "(an endpoint it manages); null: the ingest's base URL and the endpoint's id.",
    )


class JobSpec(BaseModel):
    """A job as submitted (``POST /v1/jobs``, ``framerelay jobs submit``). Strict."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    id: str | None = Field(None, pattern=JOB_ID, description="Default: generated.")
    inputs: list[str] = Field(
        min_length=1, max_length=MAX_INPUTS,
        description="Recorded segments, files or URLs, in order. A recording directory "
        "stands for its segments in time order.",
    )  # fmt: skip
    model: str = Field(BUILTIN_NAME, pattern=MODEL_NAME)
    priority: Literal["standard", "batch"] = Field(
        "batch", description="batch: only on batch-only (spot, scale-to-zero) capacity."
    )
    fps: float = Field(0.0, ge=0, le=240, description="Frames a second to analyse; 0: all.")
    max_parallel: int = Field(4, ge=1, le=256, description="Tasks running at once.")
    serverless: bool | None = Field(
        None, description="Run the tasks on a serverless tier (one with a "
        "serverless_endpoint_id): null, when the orchestrator has one the priority allows "
        "(the cheapest a second of execution); true: only there (refused without one); "
        "false: on pods.",
    )  # fmt: skip


class TaskProgress(BaseModel):
    """One task's progress, kept by the ingest that runs it (readers ignore new fields)."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    state: TaskState = "pending"
    frames_done: int = Field(0, ge=0)
    frames_total: int | None = Field(None, ge=0, description="None until the input is open.")
    checkpoint_pts: int | None = Field(
        None, description="Every sampled frame below this PTS is in the sidecar."
    )
    time_base: tuple[int, int] | None = None
    error: str | None = Field(None, max_length=500)
    updated_at: float = 0.0
    execution_s: float | None = Field(
        None, ge=0, description="On a serverless endpoint: the worker seconds its jobs were "
        "billed so far (RunPod's executionTime, added up over the task's runs); null: a tunnel.",
    )  # fmt: skip


class JobStatus(BaseModel):
    """A job as the API shows it (``GET /v1/jobs/{id}``)."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    id: str
    spec: JobSpec
    state: JobState
    tasks: list[TaskProgress]
    frames_done: int = 0
    frames_total: int | None = None
    submitted_at: float
    started_at: float | None = None
    finished_at: float | None = None
    eta_s: float | None = None
    cost_usd: float = 0.0
    error: str | None = None


def task_stream_id(job_id: str, index: int) -> str:
    """The stream that runs input ``index`` of job ``job_id``."""
    if not _JOB_ID.fullmatch(job_id) or not 0 <= index < MAX_INPUTS:
        raise ValueError(f"not a job task: {job_id[:40]!r}/{index}")
    return f"job-{job_id}-{index}"


def _task_key(prefix: str, job_id: str, index: int) -> str:
    return f"{prefix}:job:{job_id}:{index}"


def checkpoint_key(prefix: str, job_id: str, index: int) -> str:
    """Redis string: the task's :class:`TaskProgress` JSON is at :func:`progress_key`; this
    holds only the checkpoint PTS (an integer), moved with ``SET`` after a sidecar flush."""
    return _task_key(prefix, job_id, index) + ":checkpoint"


def progress_key(prefix: str, job_id: str, index: int) -> str:
    """Redis string: the task's :class:`TaskProgress` as JSON."""
    return _task_key(prefix, job_id, index) + ":progress"


def frame_result_id(index: int, pts: int) -> ResultId:
    """A job result's id: fixed by the frame (input ``index``, its PTS), not by the clock, so
    a frame answered twice is written to the sidecar once. Ordered by PTS within a task."""
    if pts < 0:
        raise ValueError(f"a job frame has a PTS >= 0, not {pts}")
    return ResultId(pts, index)
