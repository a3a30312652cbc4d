"""Run ``framerelay`` sub-commands as real processes, several at once (each costs about
a second of imports), each bounded: one that does not exit in time is killed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT, TIMEOUT_FACTOR


@dataclass(frozen=True)
class Run:
    rc: int
    stdout: str
    stderr: str


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any FRAMERELAY_ variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAMERELAY_")}
    return env | extra


def run_all(cases: list[tuple[list[str], dict[str, str]]], cwd: Path = ROOT,
            timeout_s: float = 60.0) -> list[Run]:  # fmt: skip
    """``python -m framerelay ARGS`` for each ``(args, env)``, concurrently."""
    procs = [
        subprocess.Popen([sys.executable, "-m", "framerelay", *args], env=env, cwd=cwd,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for args, env in cases
    ]  # fmt: skip
    deadline = time.monotonic() + timeout_s * TIMEOUT_FACTOR
    runs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        runs.append(Run(proc.returncode, out, err))
    return runs
