"""Prometheus' own linter on the metrics the services expose (``promtool``, from the
Debian package prometheus that scripts/services.sh installs)."""

from __future__ import annotations

import shutil
import subprocess

import pytest


def promtool(text: str) -> tuple[int, str]:
    """``promtool check metrics`` on an exposition text: its exit status and what it said."""
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool not found: run scripts/services.sh (Debian package prometheus)")
    done = subprocess.run(
        [tool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    return done.returncode, (done.stdout + done.stderr).strip()
