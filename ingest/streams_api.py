"""Stream management REST API: list streams with their state and counters."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ingest.service import IngestService


def streams_router(service: IngestService) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/streams")
    async def streams() -> list[dict[str, Any]]:
        return [s.describe() for s in service.streams.values()]

    return router
