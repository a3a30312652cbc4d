"""Fixtures of the integration tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """tests/conftest.py's backend (asyncio) at module scope, so that a module-scoped async
    fixture can run too (test_bad_input.py's ``outcome``: one scenario that the module's
    tests read). The event loop lives as long as the async fixtures and tests that use it;
    tests without such a fixture still get a loop each."""
    return "asyncio"
