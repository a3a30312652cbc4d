"""``framerelay jobs submit|status|list|cancel``: batch jobs on recordings (issue 18).

``submit`` sends a job to the orchestrator (``POST /v1/jobs``): local inputs are made
absolute here (the orchestrator and the ingest read them where they are, on a filesystem
they share with this machine), URLs go as they are. ``--wait`` (and ``status --wait``)
follows it to the end with a progress bar on stderr (frames done/total, ETA, cost so
far) and exits 0 when it is done, 1 when it failed or was cancelled. The orchestrator's
address and token are those of ``framerelay streams`` (scopes ``jobs:read``,
``jobs:write``).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

from framerelay.commands._orch_client import add_url, call, emit, table
from framerelay.commands._types import finite_float
from framerelay.errors import ConfigError

HELP = "batch jobs: re-process recordings, files or URLs with a model (via the orchestrator)"
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]{0,31}://")
POLL_S = 1.0
BAR = 30


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("jobs", help=HELP, description=HELP)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    submit = verbs.add_parser("submit", help="submit a job")
    submit.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="recorded segments, files, recording directories or URLs")  # fmt: skip
    submit.add_argument("--model", required=True, help="a model of the registry")
    pri = "batch (default): batch-only capacity only (spot, from zero)"
    submit.add_argument("--priority", choices=["batch", "standard"], default="batch", help=pri)
    submit.add_argument("--fps", type=finite_float, default=0.0,
                        help="frames a second to analyse (default 0: every frame)")  # fmt: skip
    submit.add_argument("--max-parallel", type=int, default=4, help="tasks at once (default 4)")
    where = "only on a serverless tier, or (--no-...) on pods; default: serverless if any"
    submit.add_argument("--serverless", action=argparse.BooleanOptionalAction, default=None,
                        help=where)  # fmt: skip
    submit.add_argument("--id", help="the job's id (default: generated)")
    submit.add_argument("--wait", action="store_true", help="follow it to the end")
    add_url(submit)
    submit.set_defaults(func=_submit)
    status = verbs.add_parser("status", help="a job's progress, cost and tasks")
    status.add_argument("id")
    status.add_argument("--wait", action="store_true", help="follow it to the end")
    add_url(status)
    status.set_defaults(func=_status)
    ls = verbs.add_parser("list", aliases=["ls"], help="every job kept")
    add_url(ls)
    ls.set_defaults(func=_list)
    cancel = verbs.add_parser("cancel", help="cancel a job (its task streams stop)")
    cancel.add_argument("id")
    add_url(cancel)
    cancel.set_defaults(func=_cancel)


def absolute(text: str) -> str:
    """A local input as an absolute path; a URL as it is."""
    return text if _URL.match(text) else str(Path(text).expanduser().resolve())


def _submit(args: argparse.Namespace) -> int:
    inputs = [absolute(i) for i in args.inputs]
    body: dict[str, Any] = {"inputs": inputs, "model": args.model, "priority": args.priority,
                            "fps": args.fps, "max_parallel": args.max_parallel}  # fmt: skip
    if args.id is not None:
        body["id"] = args.id
    if args.serverless is not None:
        body["serverless"] = args.serverless
    try:
        job = call(args, "POST", "/v1/jobs", body)
    except ConfigError as exc:
        raise ConfigError(_name_inputs(str(exc), args.inputs)) from None
    if not args.wait:
        return emit(args, job, f"submitted job {job['id']}: {len(job['tasks'])} task(s)")
    print(f"submitted job {job['id']}: {len(job['tasks'])} task(s)", file=sys.stderr)
    return _follow(args, job["id"])


def _name_inputs(message: str, inputs: list[str]) -> str:
    """The orchestrator's ``inputs.3`` as the input given (it never echoes inputs back)."""

    def name(m: re.Match[str]) -> str:
        i = int(m.group(1))
        return f"input {inputs[i]!r}" if 0 <= i < len(inputs) else m.group(0)

    return re.sub(r"\binputs\.(\d+)", name, message)


def _status(args: argparse.Namespace) -> int:
    if args.wait:
        return _follow(args, args.id)
    job = call(args, "GET", f"/v1/jobs/{args.id}")
    return emit(args, job, describe(job))


def _list(args: argparse.Namespace) -> int:
    jobs = call(args, "GET", "/v1/jobs")
    rows = [(j["id"], j["state"], j["spec"]["model"], len(j["tasks"]), _frames(j),
             f"${j['cost_usd']:.4f}") for j in jobs]  # fmt: skip
    return emit(args, jobs, table(rows, ("JOB", "STATE", "MODEL", "TASKS", "FRAMES", "COST")))


def _cancel(args: argparse.Namespace) -> int:
    job = call(args, "DELETE", f"/v1/jobs/{args.id}")
    return emit(args, job, f"cancelled job {job['id']}")


def _frames(job: dict[str, Any]) -> str:
    total = job.get("frames_total")
    return f"{job['frames_done']}/{'?' if total is None else total}"


def describe(job: dict[str, Any]) -> str:
    """A job in a few lines: state, frames, ETA, cost, duration, each task."""
    lines = [
        f"job {job['id']}: {job['state']}", f"frames: {_frames(job)}",
        f"eta: {_seconds(job.get('eta_s'))}", f"cost: ${job['cost_usd']:.4f}",
        f"duration: {_seconds(job.get('duration_s'))}",
    ]  # fmt: skip
    if job.get("serverless_tier"):
        lines.append(f"serverless tier: {job['serverless_tier']} "
                     f"({job.get('execution_s', 0.0):.1f} s of execution billed)")  # fmt: skip
    if job.get("error"):
        lines.append(f"error: {job['error']}")
    for k, (task, sidecar) in enumerate(zip(job["tasks"], job["sidecars"], strict=False)):
        total = "?" if task.get("frames_total") is None else task["frames_total"]
        lines.append(f"  task {k}: {task['state']} {task['frames_done']}/{total} -> {sidecar}")
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    minutes, seconds = divmod(round(value), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def progress_bar(job: dict[str, Any]) -> str:
    """One line: ``[#####.....] 120/300 frames  eta 12s  $0.0012  running``."""
    total, done = job.get("frames_total"), job["frames_done"]
    share = min(1.0, done / total) if total else 0.0
    filled = int(share * BAR)
    eta, usd = _seconds(job.get("eta_s")), job["cost_usd"]
    bar = "#" * filled + "." * (BAR - filled)
    return f"[{bar}] {_frames(job)} frames  eta {eta}  ${usd:.4f}  {job['state']}"


def _follow(args: argparse.Namespace, job_id: str) -> int:
    """Poll the job until it ends, a progress bar on stderr; its summary on stdout."""
    tty, last = sys.stderr.isatty(), ""
    while True:
        job = call(args, "GET", f"/v1/jobs/{job_id}")
        line = progress_bar(job)
        if tty or line != last:  # a log gets a line per change, a terminal one line redrawn
            print(f"\r{line}" if tty else line, end="" if tty else "\n", file=sys.stderr,
                  flush=True)  # fmt: skip
        last = line
        if job["state"] not in ("queued", "running"):
            break
        time.sleep(POLL_S)
    if tty:
        print(file=sys.stderr)
    emit(args, job, describe(job))
    return 0 if job["state"] == "done" else 1
