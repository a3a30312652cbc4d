"""Tell the ingest where each stream goes (``PUT /v1/streams/{id}/worker``; a job task on
a serverless endpoint: ``POST /v1/streams``, :mod:`deploy.serverless_jobs`).

The call is idempotent: the ingest moves a stream only when the worker
differs, carrying the stream's tracker snapshot to the new worker. The
orchestrator re-sends every assignment the ingest has not acknowledged
(after a restart: all of them), so a lost call only delays a move.

Every call carries a token (aud ``framerelay-ingest``, scopes
``routing:write streams:read``), minted with the orchestrator's keys, kept
and renewed before it expires. With a TLS pod the body names the certificate
name the ingest must verify (``tls_server_name``). An ``https://`` ingest is
verified with ``ingest_ca`` (or the system's CAs).

**Several ingests.** ``ingest_url`` may list several replicas, comma-separated
(``http://ingest-a:8080,http://ingest-b:8080``): every call goes to all of
them at once. With sharded ingests (``FRAMERELAY_INGEST_SHARDS__ENABLED``) a
replica that accepts a placement stores it in the shared Redis, so the one
that runs the stream applies it (at once, or within its renew interval): an
assignment counts as accepted when one replica accepted it, an unassignment
when every replica that answered did (404: it was gone there). Without
sharding list one ingest only: each replica would run the stream.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import ssl
import time
from pathlib import Path
from typing import Protocol

import httpx

from deploy.models import StreamSpec
from deploy.tls import describe_http_error, verify_context
from framerelay.auth import TokenIssuer
from framerelay.errors import ConfigError
from framerelay.model_registry import BUILTIN_NAME

log = logging.getLogger(__name__)
INGEST_SCOPES = ("routing:write", "streams:read")
SERVE_SCOPES = ("streams:write",)
"""A token of its own (minted at the first use) for :meth:`HttpIngestLink.serve`: a job
task on a serverless endpoint is given by its definition (``POST``/``DELETE
/v1/streams``), with no worker (:mod:`deploy.serverless_jobs`)."""
TOKEN_TTL_S = 900.0
RENEW_BEFORE_S = 180.0


class IngestLink(Protocol):
    async def assign(
        self,
        stream: StreamSpec,
        worker_id: str,
        tunnel_url: str,
        tls_server_name: str | None = None,
    ) -> bool:
        """True once the ingest accepted the assignment."""
        ...

    async def unassign(self, stream_id: str) -> bool: ...

    async def serve(self, stream: StreamSpec) -> bool:
        """True once the ingest runs ``stream`` with no worker (a job task on a serverless
        endpoint: its ingest serves it from there)."""
        ...

    async def unserve(self, stream_id: str) -> bool:
        """True once the ingest no longer runs a stream given by :meth:`serve`."""
        ...

    async def aclose(self) -> None: ...


class NullIngestLink:
    """No ingest to tell (simulations; an ingest that polls the API instead)."""

    async def assign(
        self,
        stream: StreamSpec,
        worker_id: str,
        tunnel_url: str,
        tls_server_name: str | None = None,
    ) -> bool:
        return True

    async def unassign(self, stream_id: str) -> bool:
        return True

    async def serve(self, stream: StreamSpec) -> bool:
        return True

    async def unserve(self, stream_id: str) -> bool:
        return True

    async def aclose(self) -> None:
        return None


def stream_config(stream: StreamSpec) -> dict[str, object]:
    """The ingest's stream definition for a spec (ingest.settings.StreamConfig fields;
    ``latency_slo_ms``, ``tracker_settings``, ``job`` and a ``model`` other than the
    built-in one only when set, so that the digests of older definitions hold)."""
    out: dict[str, object] = {
        "id": stream.id,
        "url": stream.url,
        "fps": stream.fps,
        "realtime": stream.realtime,
        "loop": stream.loop,
        "tracker": stream.tracker,
    }
    if stream.latency_slo_ms is not None:
        out["latency_slo_ms"] = stream.latency_slo_ms
    if stream.tracker_settings is not None:
        out["tracker_settings"] = stream.tracker_settings.model_dump(exclude_none=True)
    if stream.model != BUILTIN_NAME:  # the built-in model is every worker's default
        out["model"] = stream.model
    if stream.job is not None:  # a batch job's task (ingest.job_task)
        out["job"] = stream.job.model_dump()
    return out


def definition_key(stream: StreamSpec) -> str:
    """A digest of what the ingest runs for ``stream``: it changes whenever the stream must
    be restarted there (a new URL, rate, tracker...), not for orchestrator-only fields."""
    text = json.dumps(stream_config(stream), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class IngestToken:
    """A token for the ingest, minted once and renewed ``RENEW_BEFORE_S`` before it expires."""

    def __init__(
        self,
        issuer: TokenIssuer,
        *,
        ttl_s: float = TOKEN_TTL_S,
        scopes: tuple[str, ...] = INGEST_SCOPES,
    ) -> None:
        self._issuer = issuer
        self._scopes = scopes
        self._ttl_s = ttl_s
        self._token = ""
        self._renew_at = 0.0

    def get(self) -> str:
        now = time.time()
        if now >= self._renew_at:
            self._token = self._issuer.mint("orchestrator", self._scopes, self._ttl_s, aud="ingest")
            self._renew_at = now + max(1.0, self._ttl_s - RENEW_BEFORE_S)
        return self._token


class HttpIngestLink:
    def __init__(
        self,
        base_url: str,
        issuer: TokenIssuer,
        *,
        timeout_s: float = 5.0,
        ca: Path | None = None,
    ) -> None:
        urls = ingest_urls(base_url)
        verify: ssl.SSLContext | bool = verify_context(ca, "the ingest API") if ca else True
        self._https = [httpx.AsyncClient(base_url=u, timeout=timeout_s, verify=verify)
                       for u in urls]  # fmt: skip
        self._token = IngestToken(issuer)
        self._serve_token = IngestToken(issuer, scopes=SERVE_SCOPES)

    async def assign(
        self,
        stream: StreamSpec,
        worker_id: str,
        tunnel_url: str,
        tls_server_name: str | None = None,
    ) -> bool:
        body: dict[str, object] = {
            "worker_id": worker_id,
            "url": tunnel_url,
            "stream": stream_config(stream),
        }
        if tls_server_name is not None:
            body["tls_server_name"] = tls_server_name
        answers = await self._fan_out("PUT", f"/v1/streams/{stream.id}/worker", body)
        return any(answers)

    async def unassign(self, stream_id: str) -> bool:
        answers = await self._fan_out("DELETE", f"/v1/streams/{stream_id}/worker", None)
        reached = [a for a in answers if a is not None]
        return bool(reached) and all(reached)

    async def serve(self, stream: StreamSpec) -> bool:
        """``POST /v1/streams`` with the definition (the ingest stores it; 409: it runs
        there already, this same definition since the fleet withdraws a changed one first)."""
        body = stream_config(stream)
        answers = await self._fan_out("POST", "/v1/streams", body, self._serve_token)
        return any(answers)

    async def unserve(self, stream_id: str) -> bool:
        """``DELETE /v1/streams/{id}`` (404: gone there already)."""
        answers = await self._fan_out("DELETE", f"/v1/streams/{stream_id}", None, self._serve_token)
        reached = [a for a in answers if a is not None]
        return bool(reached) and all(reached)

    async def _fan_out(
        self,
        method: str,
        path: str,
        body: dict[str, object] | None,
        token: IngestToken | None = None,
    ) -> list[bool | None]:
        """Every replica's answer: True (accepted), False (refused), None (unreachable)."""
        bearer = (token or self._token).get()
        calls = (self._call(http, method, path, body, bearer) for http in self._https)
        return list(await asyncio.gather(*calls))

    async def _call(
        self,
        http: httpx.AsyncClient,
        method: str,
        path: str,
        body: dict[str, object] | None,
        bearer: str,
    ) -> bool | None:
        headers = {"Authorization": f"Bearer {bearer}"}
        try:
            resp = await http.request(method, path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            log.warning("ingest %s %s%s failed: %s", method, http.base_url, path,
                        describe_http_error(exc))  # fmt: skip
            return None
        if resp.status_code >= 400 and not _settled(method, resp.status_code):
            log.warning("ingest %s %s%s: HTTP %d %s", method, http.base_url, path,
                        resp.status_code, _detail(resp))  # fmt: skip
            return False
        return True

    async def aclose(self) -> None:
        await asyncio.gather(*(http.aclose() for http in self._https))


def ingest_urls(value: str) -> list[str]:
    """The ingest replicas in ``ingest_url`` (comma-separated), each without a final /."""
    urls = [u.strip().rstrip("/") for u in value.split(",") if u.strip()]
    if not urls:
        raise ConfigError("FRAMERELAY_ORCH_INGEST_URL names no ingest")
    return urls


def _settled(method: str, status: int) -> bool:
    """An error answer that means the call's end holds: gone (DELETE), there (POST)."""
    return (method, status) in (("DELETE", 404), ("POST", 409))


def _detail(resp: httpx.Response) -> str:
    """The ingest's error message (its ``detail``), never our request."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:200]
    detail = body.get("detail") if isinstance(body, dict) else body
    return str(detail)[:200]
