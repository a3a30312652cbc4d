"""Every benchmark answers ``--help`` at once and imports no test code.

The benches themselves never run here (ARCHITECTURE.md: ``bench/`` is not run
by the test suite): ``--help`` must print the usage and exit before any server,
worker or Redis starts, and write nothing.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
BENCHES = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))
SOURCES = sorted(p.relative_to(ROOT).as_posix() for p in BENCH.rglob("*.py"))
HELP_S = 10.0
"""Generous for a loaded 2-core machine: imports only (about 1 s); a bench that
starts anything takes far longer."""


def _results() -> dict[str, float]:
    folder = BENCH / "results"
    return {p.name: p.stat().st_mtime for p in folder.glob("*")} if folder.is_dir() else {}


def test_every_bench_is_found() -> None:
    assert {"fleet.py", "gc_pause.py", "soak.py", "pipeline.py"} <= set(BENCHES)


@pytest.mark.parametrize("bench", BENCHES)
def test_help_prints_usage_and_exits_at_once(bench: str) -> None:
    before = _results()
    started = time.monotonic()
    run = subprocess.run([sys.executable, f"bench/{bench}", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    took = time.monotonic() - started
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("usage:"), run.stdout[:300]
    assert "--help" in run.stdout
    assert took < HELP_S, f"bench/{bench} --help took {took:.1f} s: it does more than print"
    assert _results() == before, f"bench/{bench} --help wrote into bench/results"


def _imported(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports (function-level imports too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("source", SOURCES)
def test_no_bench_imports_the_test_suite(source: str) -> None:
    forbidden = _imported(ROOT / source) & {"tests", "pytest", "_pytest", "conftest"}
    assert not forbidden, f"{source} imports {sorted(forbidden)}: move what it needs to bench/rig"
