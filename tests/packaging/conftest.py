"""One wheel build and one venv install for every packaging test (see wheel_env.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.packaging.wheel_env import InstalledWheel, build_wheel, install, workspace


@pytest.fixture(scope="session")
def installed_wheel() -> Iterator[InstalledWheel]:
    root = workspace()
    try:
        yield install(build_wheel(root), root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
