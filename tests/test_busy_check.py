"""scripts/busy-check.py: the suite's runs beside CPU hogs, the failures reported, the
hogs gone afterwards.

It runs scripts/test.sh (lint left out) on a tiny test file of its own, twice: one test
fails every time, one passes only while the hogs run. Marked slow: its hogs would
load the parallel phase's machine.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, TIMEOUT_FACTOR

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "scripts" / "busy-check.py"
TINY = '''
from pathlib import Path


def hogs() -> int:
    """Processes running busy-check's Python hog (its code is in their command line)."""
    n = 0
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            n += b"os.getppid()==p" in cmdline.read_bytes()
        except OSError:
            pass
    return n


def test_two_hogs_run_beside() -> None:
    assert hogs() >= 2


def test_fails() -> None:
    assert 1 == 2
'''


def _group_members(pgids: set[int]) -> list[str]:
    """``/proc/<pid>/stat`` of every process whose process group is one of ``pgids``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rpartition(")")[2].split()  # state, ppid, pgrp, ...
        if int(fields[2]) in pgids:
            found.append(text)
    return found


def test_two_runs_report_the_failing_test_and_leave_no_hog(tmp_path: Path) -> None:
    (tmp_path / "test_tiny.py").write_text(TINY)
    run = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--runs",
            "2",
            "--hog",
            "python",
            "--quiet",
            "--log-dir",
            str(tmp_path / "logs"),
            "--",
            str(tmp_path / "test_tiny.py"),
        ],
        cwd=ROOT,
        env=os.environ | {"FRAMERELAY_TEST_WORKERS": "0"},
        capture_output=True,
        text=True,
        timeout=300 * TIMEOUT_FACTOR,
    )
    out = run.stdout
    assert run.returncode == 1, out + run.stderr
    groups = re.search(r"2 hogs \(Python busy loops\), process groups \[(\d+), (\d+)\]", out)
    assert groups, out
    assert _group_members({int(g) for g in groups.groups()}) == [], "a hog outlived the check"
    for n in (1, 2):
        assert re.search(rf"^run {n}: \d+ s, exit 1, 1 failed", out, re.M), out
        assert (tmp_path / "logs" / f"run-{n}.log").is_file()
    assert out.count("test_tiny.py::test_fails\n") == 2, out
    assert "test_two_hogs_run_beside" not in out, out
    assert re.search(r"1 test\(s\) failed at least once:\n .*::test_fails \(2 of 2 runs\)", out)
