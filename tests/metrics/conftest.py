"""The module-scoped ingest fixtures here are async (``running_ingest`` subscribes to its
results on the event loop) and serve sync tests: anyio sets up an async fixture of a
wider scope only when ``anyio_backend`` has that scope too, and only for tests that
request it (the modules' ``usefixtures("anyio_backend")``)."""

import pytest


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """tests/conftest.py's backend (asyncio), module-scoped for this folder."""
    return "asyncio"
