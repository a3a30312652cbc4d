"""Fixtures of the results-delivery tests."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from framerelay.results import ResultRecord
from tests.conftest import CLIP, TIMEOUT_FACTOR


@pytest.fixture(scope="session")
def real_results(
    local_worker: object, secret: str, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """Every result of the sample clip from the real pipeline (worker process), as JSONL."""
    from ingest.service import IngestService
    from ingest.settings import IngestSettings, StreamConfig

    settings = IngestSettings(
        worker_url=local_worker.url,  # type: ignore[attr-defined]
        token_secrets=secret,
        worker_id="test-worker",
        streams=[StreamConfig(id="cam-1", url=str(CLIP), fps=0)],
    )
    records: list[ResultRecord] = []

    async def main() -> None:
        service = IngestService(settings)
        service.bus.tap(records.append)
        async with asyncio.timeout(120 * TIMEOUT_FACTOR):
            await service.run(asyncio.Event(), until_finished=True)

    asyncio.run(main())
    assert len(records) >= 170, f"the pipeline gave only {len(records)} results"
    path = tmp_path_factory.mktemp("results") / "stadtmitte.jsonl"
    path.write_text("".join(r.model_dump_json() + "\n" for r in records), encoding="utf-8")
    return path
