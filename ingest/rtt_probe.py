"""Round trips from this ingest to a worker, for the orchestrator's placement (issue 18).

The orchestrator places streams by latency: a worker close to the ingest (and so to the
cameras) before one far away, and a stream with ``latency_slo_ms`` only where the round
trip plus the worker's processing fits its budget. The orchestrator may run anywhere, so
the ingest measures, on the tunnel itself:

* ``POST /v1/rtt`` ``{"worker_id", "url", "tls_server_name"?, "pings"?}`` (scope
  ``routing:write``, the scope that may point streams at that URL): the ingest opens a
  tunnel to the worker exactly as it does for frames (a token for ``worker:<id>``, its
  TLS settings and CA, the same URL rules: plain ``ws://`` only to this host unless
  ``allow_insecure_workers``), waits for the worker's HELLO, then sends ``pings``
  WebSocket pings one after the other (default 5, at most 20), then ``frames`` probe
  frames (default 3, at most 10, 0 for none: a uniform grey image at the worker's input
  size, on a stream of its own, one at a time) and answers ``{"worker_id", "rtt_ms",
  "samples_ms", "frame_ms", "processing_ms"}``: each ping's round trip and their median,
  each frame's round trip, and the worker's processing time as the ingest sees it (the
  frames' median less the pings', so the worker's queueing, batching, decoding and
  inference; null without frames), in ms.
  A URL the ingest must not use is a 422; a worker that cannot be reached or does not
  answer within ``PROBE_TIMEOUT_S`` is a 502 saying why (never a token).

A probe is a short tunnel like any other (the worker counts it; no stream is opened);
at most ``MAX_CONCURRENT`` run at once, the others wait their turn.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import WebSocketException

from framerelay import wire
from framerelay.auth.tokens import WORKER_ID
from framerelay.auth.web import ApiAuth, AuthFirstRoute
from framerelay.credits import CreditWindow
from framerelay.errors import ConfigError, FramerelayError
from framerelay.letterbox import LetterboxedJpeg, letterbox_jpeg
from framerelay.openapi_docs import errors
from framerelay.protocol import (
    HelloReceived,
    IngestProtocol,
    ResultReceived,
    probe_failure,
)
from framerelay.protocol import negotiation as versions
from ingest import tunnel_hints
from ingest.auth import HOSTNAME, check_worker_url, tunnel_tokens
from ingest.settings import IngestSettings
from ingest.tunnel_client import client_ssl_context

DEFAULT_PINGS = 5
MAX_PINGS = 20
DEFAULT_FRAMES = 3
MAX_FRAMES = 10
PROBE_STREAM = "framerelay-rtt-probe"
GREY = 114
PROBE_TIMEOUT_S = 10.0
"""Most one probe may take, connect and pings together."""
MAX_CONCURRENT = 8
REASON_CHARS = 300


class ProbeFailed(FramerelayError):
    """The worker could not be reached, or did not answer in time."""


class RttRequest(BaseModel):
    """Which worker to measure, and how (the fields of a placement, ``ingest.routing``)."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    worker_id: str = Field(
        pattern=WORKER_ID,
        description="The worker's name (letters, digits, ._-; never * or a pattern): the "
        "ingest mints this worker's tunnel token from it.",
    )
    url: str = Field(pattern=r"^wss?://", max_length=2048)
    tls_server_name: str | None = Field(
        None, pattern=HOSTNAME, max_length=253,
        description="The DNS name the worker's certificate must carry (wss:// only).",
    )  # fmt: skip
    pings: int = Field(DEFAULT_PINGS, ge=1, le=MAX_PINGS, description="Pings, one at a time.")
    frames: int = Field(
        DEFAULT_FRAMES, ge=0, le=MAX_FRAMES, description="Probe frames, one at a time."
    )


@dataclass(frozen=True, slots=True)
class Measured:
    """One probe: each ping's and each frame's round trip, ms."""

    pings_ms: list[float]
    frames_ms: list[float]

    @property
    def rtt_ms(self) -> float:
        return statistics.median(self.pings_ms)

    @property
    def processing_ms(self) -> float | None:
        """The frames' median round trip less the pings' (None without frames)."""
        if not self.frames_ms:
            return None
        return max(0.0, statistics.median(self.frames_ms) - self.rtt_ms)


class RttProber:
    """Opens a tunnel to a worker, as the ingest would for frames, and pings it."""

    def __init__(
        self,
        token_for: Callable[[str], str],
        ssl_context: ssl.SSLContext | None,
        *,
        allow_insecure: bool = False,
        timeout_s: float = PROBE_TIMEOUT_S,
    ) -> None:
        self._token_for = token_for
        self._ssl = ssl_context
        self.allow_insecure = allow_insecure
        self.timeout_s = timeout_s
        self._gate = asyncio.Semaphore(MAX_CONCURRENT)

    @classmethod
    def of(cls, settings: IngestSettings) -> RttProber:
        """With the ingest's tunnel credentials, CA and client certificate."""
        ctx = client_ssl_context(
            str(settings.tls_ca) if settings.tls_ca else None,
            str(settings.tls_client_cert) if settings.tls_client_cert else None,
            str(settings.tls_client_key) if settings.tls_client_key else None,
        )
        return cls(tunnel_tokens(settings), ctx, allow_insecure=settings.allow_insecure_workers)

    async def measure(
        self, worker_id: str, url: str, tls_server_name: str | None = None,
        pings: int = DEFAULT_PINGS, frames: int = DEFAULT_FRAMES,
    ) -> Measured:  # fmt: skip
        """Each ping's and frame's round trip; ConfigError for a URL this ingest must not
        use, ProbeFailed when the worker cannot be reached, refuses the frames or is too
        slow to answer."""
        check_worker_url(url, allow_insecure=self.allow_insecure, tls_server_name=tls_server_name)
        tunnel_hints.check_url(url, self._ssl, tls_server_name)
        async with self._gate:
            try:
                async with asyncio.timeout(self.timeout_s):
                    return await self._probe(worker_id, url, tls_server_name, pings, frames)
            except TimeoutError:
                raise ProbeFailed(
                    f"worker {worker_id} did not answer {pings} pings within {self.timeout_s:g} s"
                ) from None
            except (OSError, WebSocketException) as exc:
                why = tunnel_hints.describe(url, exc)[:REASON_CHARS]
                raise ProbeFailed(f"worker {worker_id} cannot be reached: {why}") from None

    async def _probe(
        self, worker_id: str, url: str, tls_server_name: str | None, pings: int, frames: int
    ) -> Measured:
        tls: dict[str, Any] = {}
        if url.startswith("wss://"):
            tls["ssl"] = self._ssl
            if tls_server_name:
                tls["server_hostname"] = tls_server_name
        async with connect(
            url,
            additional_headers={"Authorization": f"Bearer {self._token_for(worker_id)}"},
            compression=None,
            proxy=None,
            open_timeout=self.timeout_s,
            ping_interval=None,
            max_size=wire.DEFAULT_LIMITS.max_message,
            subprotocols=versions.offer(),
            **tls,
        ) as ws:
            proto = IngestProtocol(versions.accepted(ws.subprotocol))
            hello = (await _next(ws, proto, HelloReceived)).hello  # its session is up
            pinged = [await _one_ping(ws) for _ in range(pings)]
            if not frames:
                return Measured(pinged, [])
            image = await asyncio.to_thread(_grey, hello.input_w, hello.input_h)
            await ws.send(proto.open_stream(PROBE_STREAM, CreditWindow(cap=1), "none"))
            sent = [await _one_frame(ws, proto, image, seq) for seq in range(frames)]
            await ws.send(proto.close_stream(PROBE_STREAM))
            return Measured(pinged, sent)


async def _one_ping(ws: ClientConnection) -> float:
    t0 = time.monotonic()
    pong = await ws.ping()
    await pong
    return (time.monotonic() - t0) * 1000


@functools.lru_cache(maxsize=8)
def _grey(w: int, h: int) -> LetterboxedJpeg:
    """A uniform grey frame of the worker's input size, encoded (cached per size)."""
    return letterbox_jpeg(np.full((h, w, 3), GREY, np.uint8), w, h)


async def _one_frame(
    ws: ClientConnection, proto: IngestProtocol, image: LetterboxedJpeg, seq: int
) -> float:
    lb = image.letterbox
    frame = wire.Frame(
        stream_id=PROBE_STREAM, epoch=0, seq=seq, pts=seq, time_base=(1, 25),
        captured_at=time.time(), src_w=lb.src_w, src_h=lb.src_h, scale=lb.scale,
    )  # fmt: skip
    t0 = time.monotonic()
    await ws.send(proto.send_frame(frame, image.data, t0))
    await _next(ws, proto, ResultReceived)
    return (time.monotonic() - t0) * 1000


_E = TypeVar("_E", HelloReceived, ResultReceived)


async def _next(ws: ClientConnection, proto: IngestProtocol, kind: type[_E]) -> _E:
    """Read until an event of ``kind``; the worker's error or a protocol error raises
    ProbeFailed (the probe's timeout bounds the wait)."""
    while True:
        for event in proto.receive_data(await ws.recv(decode=False), time.monotonic()):
            if isinstance(event, kind):
                return event
            if (why := probe_failure(event)) is not None:
                raise ProbeFailed(f"the probe: {why}")


def rtt_router(prober: RttProber, api: ApiAuth) -> APIRouter:
    """``POST /v1/rtt`` (see the module)."""
    router = APIRouter(route_class=AuthFirstRoute)

    @router.post("/v1/rtt", dependencies=[api.requires("routing:write")], tags=["routing"],
                 summary="Measure the round trip to a worker",
                 responses=errors(502, e502="The worker cannot be reached or did not "
                                  "answer in time"))  # fmt: skip
    async def rtt(body: RttRequest) -> dict[str, Any]:
        """The orchestrator's: the round trip from this ingest to a worker, measured with
        WebSocket pings on a tunnel to it, and its processing time from probe frames."""
        try:
            found = await prober.measure(body.worker_id, body.url, body.tls_server_name,
                                         body.pings, body.frames)  # fmt: skip
        except ConfigError as exc:
            raise HTTPException(422, str(exc)) from None
        except ProbeFailed as exc:
            raise HTTPException(502, str(exc)) from None
        processing = found.processing_ms
        return {
            "worker_id": body.worker_id,
            "rtt_ms": round(found.rtt_ms, 3),
            "samples_ms": [round(s, 3) for s in found.pings_ms],
            "frame_ms": [round(s, 3) for s in found.frames_ms],
            "processing_ms": None if processing is None else round(processing, 3),
        }

    return router
