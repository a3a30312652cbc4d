"""What the console's orchestrator panels share: one feed per panel for every console.

A panel (:mod:`ingest.console_fleet`, :mod:`ingest.console_jobs`) shows what the
orchestrator says, read over HTTP (:mod:`ingest.orchestrator_client`). Its
:class:`OrchestratorFeed` asks at most once per ``every_s`` (:data:`REFRESH_S`), only while
someone reads the panel, and answers every other console from the last answer (one
caller refreshes, the others wait for it). When the orchestrator fails (unreachable,
timed out, refused the token, sent something unreadable) the panel keeps the last good
data and says how old it is and why (``error``: one line, never a secret), logged once
per new reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from fastapi import Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from ingest.orchestrator_client import OrchestratorClient, OrchestratorError

log = logging.getLogger(__name__)
REFRESH_S = 2.0
"""The orchestrator is asked at most this often, however many consoles read a panel."""
NOT_CONFIGURED = b'{"configured":false}'
NO_STORE = {"Cache-Control": "no-store"}


class OrchestratorFeed:
    """A panel's data from the orchestrator, refreshed at most every ``every_s`` while
    read. Subclasses fetch, check and keep it in :meth:`_fetch` (keeping nothing unless all
    of it was read) and build the panel."""

    panel_name = "panel"
    """How logs and errors name the panel."""

    def __init__(
        self,
        client: OrchestratorClient,
        *,
        every_s: float = REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.every_s = every_s
        self._clock = clock
        self._lock = asyncio.Lock()
        self._tried_at: float | None = None
        self._fetched_at: float | None = None
        """Unix time of the last good answer (None: none yet)."""
        self._error: str | None = None

    async def refresh_if_due(self) -> None:
        """Refresh first when the last try is ``every_s`` old (one caller refreshes, the
        others wait for it and share its answer)."""
        async with self._lock:
            now = self._clock()
            if self._tried_at is None or now - self._tried_at >= self.every_s:
                self._tried_at = now
                await self._refresh(now)

    async def panel(self) -> BaseModel:
        """The panel now (refreshed first if due)."""
        await self.refresh_if_due()
        return self._view()

    def _view(self) -> BaseModel:
        raise NotImplementedError

    async def _fetch(self, now: float) -> None:
        """Ask the orchestrator, check its answers, keep them (all or nothing). Raises
        OrchestratorError, ValidationError; runs under the refresh's deadline."""
        raise NotImplementedError

    def _problem(self, exc: ValidationError) -> str:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the answer"
        return f"the orchestrator's answer is not what this ingest reads ({where}: {first['msg']})"

    async def _refresh(self, now: float) -> None:
        deadline = self.client.deadline_s
        try:
            async with asyncio.timeout(deadline):
                await self._fetch(now)
        except TimeoutError:
            return self._failed(f"the orchestrator did not answer within {deadline:g} s")
        except OrchestratorError as exc:
            return self._failed(str(exc))
        except ValidationError as exc:
            return self._failed(self._problem(exc))
        self._fetched_at = time.time()
        if self._error is not None:
            log.info("the orchestrator answers again (%s)", self.panel_name)
        self._error = None

    def _failed(self, why: str) -> None:
        if why != self._error:  # once per new reason, not every refresh
            log.warning("%s: %s", self.panel_name, why)
        self._error = why

    def _age(self) -> dict[str, Any]:
        """The fields every panel has about its freshness."""
        at = self._fetched_at
        return {
            "configured": True, "orchestrator": self.client.url, "fetched_at": at,
            "age_s": round(max(0.0, time.time() - at), 1) if at is not None else None,
            "stale": self._error is not None and at is not None, "error": self._error,
        }  # fmt: skip


async def panel_response(feed: OrchestratorFeed | None) -> Response:
    """A panel route's answer: ``{"configured": false}`` without an orchestrator, else the
    panel after a refresh if one is due; never cached."""
    if feed is None:
        return Response(NOT_CONFIGURED, media_type="application/json", headers=NO_STORE)
    panel = await feed.panel()
    return JSONResponse(panel.model_dump(mode="json"), headers=NO_STORE)
