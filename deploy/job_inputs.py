"""A job's inputs as tasks (issue 18): what each task's ingest opens, where its results go.

An input is one of:

* a recorded segment or any video file: an **absolute** local path (``framerelay jobs
  submit`` makes relative paths absolute) on a filesystem the orchestrator and the ingest
  share; its sidecar is written beside it, ``<input stem>.<job id>.jsonl``;
* a recording directory (the recorder's ``<out>/<stream>``, holding ``index.json``): it
  stands for its finished segments (``complete`` or ``partial``; one still being recorded
  is left out) in time order (wall-clock start, then recorder epoch and PTS);
* a URL (``scheme://...``, anything the ingest's PyAV opens): its sidecar goes under
  ``FRAMERELAY_ORCH_JOBS__OUTPUT_DIR``, ``<dir>/<job id>/<k>-<name>.<job id>.jsonl``
  (without that setting a URL is refused). ``file://`` URLs are local paths.

Errors say which input and why, never the input itself (it may hold a password).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from framerelay.jobs import MAX_INPUTS
from framerelay.redact import redact_url

MAX_INPUT_CHARS = 4096
"""The ingest's longest stream URL."""
MAX_INDEX_BYTES = 16 << 20
"""The largest recorder index read (a day of 2 s segments is about 20 MB... of JSON: 16 MiB
holds some 40,000 segment entries, far beyond a job's 1000 inputs)."""
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]{0,31}://")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


class JobsSettings(BaseModel):
    """Batch jobs (``FRAMERELAY_ORCH_JOBS__<NAME>``, docs/jobs.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    redis_prefix: str = Field(
        "framerelay", pattern=r"^[A-Za-z0-9._:-]{1,64}$",
        description="The ingest's results.redis_prefix: its job tasks' progress and checkpoints "
        "are under <prefix>:job:<job>:<k>: in the orchestrator's Redis (or redis_url).",
    )  # fmt: skip
    redis_url: SecretStr | None = Field(
        None, description="The ingest's Redis, when it is not the orchestrator's (a secret)."
    )
    output_dir: Path | None = Field(
        None, description="Where the sidecars of URL inputs go (<dir>/<job id>/); without "
        "it a job takes local files and recordings only.",
    )  # fmt: skip
    input_dirs: tuple[Path, ...] = Field(
        (), description="When set, local inputs must lie under one of these directories "
        "(symbolic links resolved); empty: any path the orchestrator can read.",
    )  # fmt: skip
    keep_finished: int = Field(
        1000, ge=1, le=100_000,
        description="Finished jobs kept for GET /v1/jobs; older ones go, with their tasks' "
        "progress keys.",
    )  # fmt: skip
    eta_window_s: float = Field(
        60.0, gt=0, le=3600, description="The ETA comes from the frame rate over this window."
    )


class InputError(ValueError):
    """An input that cannot be a task: where (``index``: the input, None: the list) and why."""

    def __init__(self, index: int | None, message: str) -> None:
        super().__init__(message)
        self.index = index
        self.message = message


@dataclass(frozen=True, slots=True)
class TaskInput:
    """One task: what its ingest opens and where its results go."""

    url: str
    sidecar: str


def expand_inputs(
    inputs: Sequence[str], job_id: str, output_dir: Path | None, roots: Sequence[Path] = ()
) -> list[TaskInput]:
    """The job's tasks, in input order (a recording directory: its segments in time order).

    Raises :class:`InputError` for an input that is not well-formed, does not exist, is
    not a recording, lies outside ``roots`` (when given), repeats another, or for more
    than :data:`MAX_INPUTS` tasks in all.
    """
    tasks: list[TaskInput] = []
    for i, text in enumerate(inputs):
        for url in _one(i, text, output_dir, roots):
            sidecar = _url_sidecar(url, job_id, len(tasks), output_dir, i) if _is_url(url) else (
                str(Path(url).with_name(f"{Path(url).stem}.{job_id}.jsonl"))
            )  # fmt: skip
            tasks.append(TaskInput(url, sidecar))
            if len(tasks) > MAX_INPUTS:
                why = f"the inputs stand for more than {MAX_INPUTS} files or segments"
                raise InputError(None, why + "; a job takes at most that many (submit it in parts)")
    seen: dict[str, int] = {}
    for k, task in enumerate(tasks):
        if task.sidecar in seen:
            raise InputError(None, f"task {k} repeats task {seen[task.sidecar]} (the same file "
                             "twice): each input is processed once")  # fmt: skip
        seen[task.sidecar] = k
    return tasks


def _is_url(text: str) -> bool:
    return bool(_URL.match(text)) and not text.lower().startswith("file://")


def _one(i: int, text: str, output_dir: Path | None, roots: Sequence[Path]) -> list[str]:
    """What input ``i`` stands for: itself (a file, a URL) or a recording's segments."""
    if not text or len(text) > MAX_INPUT_CHARS:
        raise InputError(i, f"an input is 1-{MAX_INPUT_CHARS} characters")
    if _CONTROL.search(text):
        raise InputError(i, "an input holds no control characters")
    if _is_url(text):
        if output_dir is None:
            raise InputError(i, "a URL input needs FRAMERELAY_ORCH_JOBS__OUTPUT_DIR (where its "
                             "sidecar goes); local files and recordings need nothing")  # fmt: skip
        return [text]
    raw = unquote(urlsplit(text).path) if text.lower().startswith("file://") else text
    if not os.path.isabs(raw):
        raise InputError(i, "a local input is an absolute path (framerelay jobs submit makes "
                         "relative paths absolute)")  # fmt: skip
    path = Path(os.path.normpath(raw))  # no '..' left (the ingest refuses it in a sidecar)
    if roots and not any(path.resolve().is_relative_to(r.resolve()) for r in roots):
        raise InputError(i, "a local input lies under FRAMERELAY_ORCH_JOBS__INPUT_DIRS")
    if path.is_dir():
        return [str(p) for p in recording_segments(i, path)]
    if not path.is_file():
        why = "no such file or directory on the orchestrator's filesystem"
        raise InputError(i, why + " (jobs read inputs where the ingest reads them too)")
    return [str(path)]


def recording_segments(i: int, directory: Path) -> list[Path]:
    """The finished segments of a recording directory, in time order."""
    index = directory / "index.json"
    if not index.is_file():
        raise InputError(i, "a directory input is a recording (the recorder's <out>/<stream>, "
                         "with index.json); this one has no index.json")  # fmt: skip
    try:
        if index.stat().st_size > MAX_INDEX_BYTES:
            raise InputError(i, f"the recording's index.json is over {MAX_INDEX_BYTES} bytes")
        raw = json.loads(index.read_text(encoding="utf-8"))
        entries = [_segment(e) for e in raw["segments"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(i, f"the recording's index.json is not a recorder index "
                         f"({type(exc).__name__})") from None  # fmt: skip
    done = sorted(e for e in entries if e is not None)
    found = [directory / name for *_, name in done if (directory / name).is_file()]
    if not found:
        raise InputError(i, "the recording has no finished segment")
    return found


def _segment(entry: Any) -> tuple[float, int, int, str] | None:
    """(start wall, epoch, start PTS, file name) of a finished segment entry; None for one
    still being recorded. A name that leaves the directory is not a recorder index."""
    name = entry["name"]
    if not isinstance(name, str) or "/" in name or "\\" in name or name in ("", ".", ".."):
        raise ValueError("a segment name is a file name")
    if entry.get("state") == "recording":
        return None
    return float(entry["start_wall"]), int(entry["epoch"]), int(entry["start_pts"]), name


def _url_sidecar(url: str, job_id: str, k: int, output_dir: Path | None, i: int) -> str:
    """``<output_dir>/<job>/<k>-<name>.<job>.jsonl``, the name from the URL's last part
    (redacted: a ``/token=...`` path parameter does not name a file shown in views)."""
    if output_dir is None:  # _one refused the URL already
        raise InputError(i, "a URL input needs FRAMERELAY_ORCH_JOBS__OUTPUT_DIR")
    last = urlsplit(redact_url(url)).path.rstrip("/").rsplit("/", 1)[-1]
    stem = _SAFE.sub("_", last.rsplit(".", 1)[0])[:64].strip("._") or "input"
    return str(output_dir / job_id / f"{k:04d}-{stem}.{job_id}.jsonl")
