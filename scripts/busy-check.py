#!/usr/bin/env python3
"""Measure flakiness: run the test suite with CPU hogs beside it and report what failed.

    scripts/busy-check.py                      # the whole suite, 2 hogs, once
    scripts/busy-check.py --runs 3             # three runs in a row
    scripts/busy-check.py --hogs 0 --runs 3    # the same, plain
    scripts/busy-check.py -- tests/ingest -k api   # a subset: pytest args after --

Each run is ``scripts/test.sh`` (what ``make test`` and CI's ``.ci/run`` run: the
parallel phase, then the slow tests) with ``FRAMERELAY_TEST_LINT=0``: lint does not
depend on the machine's load. The hogs are ``stress-ng --cpu N`` where it is installed,
else a Python busy loop per hog; each is its own process group, killed when the check
ends whatever happens (a Python hog also ends by itself once this script is gone).
Every run's output goes to ``--log-dir``; the report gives each run's wall time and
failing test ids, then how often each test failed. Exit status 0 when every run passed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[1]
TEST_SH = ROOT / "scripts" / "test.sh"
HOG_CODE = "import os,sys\np=int(sys.argv[1])\nwhile os.getppid()==p: sum(range(10**6))\n"
"""A Python hog: spins until its parent (this script) is gone, however that ends."""
FAILED = re.compile(r"^(?:FAILED|ERROR) (\S.*?)(?: - .*)?$")
"""pytest's short summary (``-ra``): ``FAILED tests/x.py::test_y[p] - message``."""


@dataclass
class Run:
    wall_s: float
    rc: int
    failed: list[str]
    log: Path


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/busy-check.py",
        description="Run the test suite (scripts/test.sh, lint left out) with CPU-bound hog "
        "processes beside it; report each run's wall time and failing tests.",
        epilog="Arguments after -- go to pytest (both phases), e.g. -- tests/ingest -k api.",
    )
    parser.add_argument("--hogs", type=int, default=2, help="CPU hog processes (default 2)")
    parser.add_argument("--runs", type=int, default=1, help="runs in a row (default 1)")
    parser.add_argument(
        "--hog",
        choices=("auto", "stress-ng", "python"),
        default="auto",
        help="what hogs: stress-ng --cpu N where installed (auto), or a Python busy loop each",
    )
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=ROOT / "test-artifacts" / "busy-check",
        help="where each run's output goes (default test-artifacts/busy-check)",
    )
    parser.add_argument("--quiet", action="store_true", help="the report only, not the output")
    parser.add_argument("pytest_args", nargs="*", help="pytest arguments (after --)")
    args = parser.parse_args(argv)
    if args.hogs < 0 or args.runs < 1:
        parser.error("--hogs must be >= 0 and --runs >= 1")
    return args


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    """End ``proc``'s whole process group (it leads one), then reap it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
            return


@contextlib.contextmanager
def hogs(count: int, kind: str) -> Iterator[list[int]]:
    """``count`` CPU hogs for the block; yields their process group ids."""
    use_stress = count > 0 and kind != "python" and shutil.which("stress-ng") is not None
    if kind == "stress-ng" and not use_stress and count > 0:
        raise SystemExit("busy-check: --hog stress-ng, but stress-ng is not installed")
    if use_stress:
        cmds = [["stress-ng", "--cpu", str(count), "--quiet"]]
    else:
        cmds = [[sys.executable, "-c", HOG_CODE, str(os.getpid())]] * count
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for cmd in cmds:
            procs.append(subprocess.Popen(cmd, start_new_session=True))  # noqa: S603 (ours)
        what = "stress-ng --cpu" if use_stress else "Python busy loops"
        print(f"busy-check: {count} hogs ({what}), process groups {[p.pid for p in procs]}")
        yield [p.pid for p in procs]
    finally:
        for proc in procs:
            _end_group(proc)


def failures(output: str) -> list[str]:
    """The failing test ids in pytest's short summary, in order, each once."""
    found = (FAILED.match(line) for line in output.splitlines())
    return list(dict.fromkeys(m.group(1) for m in found if m))


def run_once(pytest_args: Sequence[str], log: Path, echo: bool) -> Run:
    """One run of scripts/test.sh (its own process group, ended if this one is stopped)."""
    env = os.environ | {"FRAMERELAY_TEST_LINT": "0"}
    started = time.monotonic()
    out: list[str] = []
    proc = subprocess.Popen(  # noqa: S603 (the project's own script, args for pytest)
        [str(TEST_SH), *pytest_args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    stdout = proc.stdout
    if stdout is None:  # never: stdout=PIPE
        raise RuntimeError("no pipe from scripts/test.sh")
    try:
        with log.open("w", encoding="utf-8") as f:
            for raw in stdout:
                line = raw.decode(errors="replace")
                out.append(line)
                f.write(line)
                if echo:
                    sys.stdout.write(line)
                    sys.stdout.flush()
        rc = proc.wait()
    finally:
        if proc.poll() is None:
            _end_group(proc)
        stdout.close()
    return Run(time.monotonic() - started, rc, failures("".join(out)), log)


def report(runs: Sequence[Run], hog_count: int) -> str:
    lines = [f"busy-check: {len(runs)} run(s) with {hog_count} hogs"]
    for n, run in enumerate(runs, 1):
        verdict = "passed" if run.rc == 0 else f"exit {run.rc}, {len(run.failed)} failed"
        lines.append(f"run {n}: {run.wall_s:.0f} s, {verdict} (log: {run.log})")
        lines.extend(f"  {test_id}" for test_id in run.failed)
        if run.rc != 0 and not run.failed:
            lines.append("  no failing test listed: the log says what went wrong")
    counts = Counter(test_id for run in runs for test_id in run.failed)
    if counts:
        lines.append(f"{len(counts)} test(s) failed at least once:")
        lines.extend(f"  {t} ({k} of {len(runs)} runs)" for t, k in counts.most_common())
    return "\n".join(lines)


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # so that the hogs and the run are ended on the way out


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, _stop)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    with hogs(args.hogs, args.hog):
        for n in range(1, args.runs + 1):
            log = args.log_dir / f"run-{n}.log"
            print(f"busy-check: run {n} of {args.runs}", flush=True)
            runs.append(run_once(args.pytest_args, log, echo=not args.quiet))
    print(report(runs, args.hogs), flush=True)
    return 0 if all(run.rc == 0 for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
