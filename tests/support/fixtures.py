"""Session fixtures of the ingest test rig (re-exported by the conftests that use them)."""

from __future__ import annotations

import pytest

from tests.support.media import Media


@pytest.fixture(scope="session")
def media(tmp_path_factory: pytest.TempPathFactory) -> Media:
    return Media.shared(tmp_path_factory.mktemp("media"))
