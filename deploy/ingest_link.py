"""Tell the ingest where each stream goes (``PUT /v1/streams/{id}/worker``).

The call is idempotent: the ingest moves a stream only when the worker
differs, carrying the stream's tracker snapshot to the new worker. The
orchestrator re-sends every assignment the ingest has not acknowledged
(after a restart: all of them), so a lost call only delays a move.
"""

from __future__ import annotations

import logging
from typing import Protocol

import httpx

from deploy.models import StreamSpec

log = logging.getLogger(__name__)


class IngestLink(Protocol):
    async def assign(self, stream: StreamSpec, worker_id: str, tunnel_url: str) -> bool:
        """True once the ingest accepted the assignment."""
        ...

    async def unassign(self, stream_id: str) -> bool: ...

    async def aclose(self) -> None: ...


class NullIngestLink:
    """No ingest to tell (simulations; an ingest that polls the API instead)."""

    async def assign(self, stream: StreamSpec, worker_id: str, tunnel_url: str) -> bool:
        return True

    async def unassign(self, stream_id: str) -> bool:
        return True

    async def aclose(self) -> None:
        return None


def stream_config(stream: StreamSpec) -> dict[str, object]:
    """The ingest's stream definition for a spec (ingest.settings.StreamConfig fields)."""
    return {
        "id": stream.id,
        "url": stream.url,
        "fps": stream.fps,
        "realtime": stream.realtime,
        "loop": stream.loop,
        "tracker": stream.tracker,
    }


class HttpIngestLink:
    def __init__(self, base_url: str, *, timeout_s: float = 5.0) -> None:
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout_s)

    async def assign(self, stream: StreamSpec, worker_id: str, tunnel_url: str) -> bool:
        body: dict[str, object] = {
            "worker_id": worker_id,
            "url": tunnel_url,
            "stream": stream_config(stream),
        }
        return await self._call("PUT", f"/v1/streams/{stream.id}/worker", body)

    async def unassign(self, stream_id: str) -> bool:
        return await self._call("DELETE", f"/v1/streams/{stream_id}/worker", None)

    async def _call(self, method: str, path: str, body: dict[str, object] | None) -> bool:
        try:
            resp = await self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            log.warning("ingest %s %s failed: %s", method, path, type(exc).__name__)
            return False
        if resp.status_code >= 400 and not (method == "DELETE" and resp.status_code == 404):
            log.warning("ingest %s %s: HTTP %d %s", method, path, resp.status_code, resp.text[:200])
            return False
        return True

    async def aclose(self) -> None:
        await self._http.aclose()
