"""Health: heartbeats, a real-inference canary, and the restart budget.

A worker is *ready* only after a canary frame - frame 1 of the TUD-Stadtmitte
sample, which shows at least five people - went through the real tunnel
protocol (token, HELLO, OPEN, FRAME) and came back with at least
``min_persons`` person detections within the deadline. A worker hosting more
models than its default one (issue 17) has each other loaded model (its ``/info``)
checked against that model's own canary from the model registry (an image and
the detections expected on it, :class:`CanaryCheck`): a vehicle model is not
asked for persons. The canary and the
heartbeat verify the pod as the ingest does: against the orchestrator's CA
and the name in the pod's certificate (``server_hostname``), with a tunnel
token (aud ``framerelay-worker``, scope ``worker:<pod>``) on ``/info`` and the
tunnel. ``/healthz`` alone
proves only that the process answers HTTP; a hung inference thread still
answers it, the canary does not.

Heartbeats (``GET /healthz``, then ``GET /readyz``) run every tick; the
canary every ``canary_interval_s``. A worker whose ``/readyz`` fails (its
inference loop stalled or ended: it has closed its tunnels too) is not ready
at once, with the worker's own reason, and gets no canary; the fleet takes its
streams away on that pass. ``unhealthy_after`` consecutive failures of any
kind make the worker unhealthy and the orchestrator replaces it, at most
``max_replacements`` per tier per ``replacement_window_s`` (no storms).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import ssl
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol, TypeVar

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus, WebSocketException

from deploy.models import WorkerModels
from deploy.tls import describe_http_error
from framerelay import wire
from framerelay.coco import COCO_CLASSES
from framerelay.credits import CreditWindow
from framerelay.data import CANARY_STILL
from framerelay.errors import FramerelayError
from framerelay.letterbox import letterbox_jpeg, read_jpeg_rgb
from framerelay.model_registry import MODEL_NAME, ModelEntry, ModelRegistry, builtin_registry
from framerelay.protocol import (
    HelloReceived,
    IngestProtocol,
    ProtocolViolation,
    ResultReceived,
    probe_failure,
)
from framerelay.protocol import negotiation as versions

log = logging.getLogger(__name__)
PERSON = 0
TokenFn = Callable[[str], str]
"""worker name -> a token granting ``worker:<name>``."""
CANARY_STREAM = "framerelay-canary"
MAX_CAPACITY_FPS = 1_000_000.0
"""A worker's reported capacity above this (or not finite) counts as unknown (0)."""
REASON_CHARS = 200
MAX_MODELS = 16
"""Models of one worker checked per probe, at most."""
_MODEL = re.compile(MODEL_NAME)
CANARY_IMAGE = CANARY_STILL  # package data: present wherever the wheel is installed
"""Frame 1 of the TUD-Stadtmitte clip as a still (no video decoding in the orchestrator)."""


@dataclass(frozen=True, slots=True)
class Probe:
    """One health observation of a worker."""

    alive: bool
    canary_ok: bool | None = None
    """None when no canary ran this time."""
    persons: int = 0
    canary_ms: float = 0.0
    capacity_fps: float = 0.0
    error: str | None = None
    ready: bool | None = None
    """The worker's own ``/readyz``; None when not asked (it did not answer ``/healthz``)."""
    models: tuple[str, ...] = ()
    """The models loaded on the worker (its ``/info``); each was checked by its canary."""
    worker_models: WorkerModels | None = None
    """The worker's budget, loaded models and default (its ``/info``); None when ``/info``
    was not read or the worker is from before models."""
    ms_per_inference: float = 0.0
    """A full batch's inference, ms (its ``/info``): its processing time; 0 = unknown."""


class Prober(Protocol):
    async def probe(
        self, name: str, tunnel_url: str, http_url: str, *, canary: bool,
        tls_name: str | None = None,
    ) -> Probe: ...  # fmt: skip


@dataclass(frozen=True, slots=True)
class CanaryImage:
    data: bytes
    src_w: int
    src_h: int
    scale: float


@dataclass(frozen=True, slots=True)
class CanaryCheck:
    """What one model must find on its own canary image (from the model registry)."""

    model: str | None
    """None: the worker's default model (no name sent in OPEN)."""
    image: Path
    expect: Mapping[str, int]
    min_confidence: float = 0.0

    @classmethod
    def of(cls, entry: ModelEntry) -> CanaryCheck:
        spec = entry.canary
        return cls(entry.name, spec.image, dict(spec.expect), spec.min_confidence)

    def shortfall(self, counts: Mapping[str, int]) -> str | None:
        """None when every expectation is met; else what was missing, in one line."""
        short = [f"{n} {name}" for name, n in self.expect.items() if counts.get(name, 0) < n]
        if not short:
            return None
        seen = ", ".join(f"{counts.get(name, 0)} {name}" for name in self.expect)
        return f"canary of model {self.model or 'default'} saw {seen}, expected >= " + (
            ", ".join(short)
        )


class Canary:
    """Sends one known frame through the tunnel and checks the detections.

    :meth:`run` is the default model's check (``min_persons`` persons on the
    TUD-Stadtmitte still); :meth:`run_check` runs any model's own check
    (:class:`CanaryCheck`, from the model registry), naming the model in OPEN."""

    def __init__(
        self,
        still: Path = CANARY_IMAGE,
        *,
        min_persons: int = 3,
        timeout_s: float = 10.0,
        registry: ModelRegistry | None = None,
    ) -> None:
        self.still = still
        self.min_persons = min_persons
        self.timeout_s = timeout_s
        self.registry = registry or builtin_registry()
        """Whose entries give the canary of every model a worker has loaded."""
        self._images: dict[tuple[Path, int, int], CanaryImage] = {}

    @property
    def default_check(self) -> CanaryCheck:
        return CanaryCheck(None, self.still, {COCO_CLASSES[PERSON]: self.min_persons})

    def check_for(self, model: str) -> CanaryCheck | None:
        """The registry's check of ``model``; None for a model the registry lacks."""
        entry = self.registry.entries.get(model)
        return None if entry is None else CanaryCheck.of(entry)

    def image(self, w: int, h: int, still: Path | None = None) -> CanaryImage:
        """The still, letterboxed and encoded for a (w, h) model."""
        path = still or self.still
        if (path, w, h) not in self._images:
            prepared = letterbox_jpeg(read_jpeg_rgb(path), w, h)
            lb = prepared.letterbox
            self._images[(path, w, h)] = CanaryImage(prepared.data, lb.src_w, lb.src_h, lb.scale)
        return self._images[(path, w, h)]

    async def run(
        self,
        tunnel_url: str,
        token: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> tuple[int, float]:
        """(persons detected, round trip ms); raises on any failure or timeout."""
        counts, ms = await self.run_check(
            tunnel_url, token, self.default_check, ssl_context=ssl_context,
            server_hostname=server_hostname,
        )  # fmt: skip
        return counts.get(COCO_CLASSES[PERSON], 0), ms

    async def run_check(
        self,
        tunnel_url: str,
        token: str,
        check: CanaryCheck,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> tuple[dict[str, int], float]:
        """(detections per class name, round trip ms) of ``check``'s model on its image;
        raises on any failure or timeout."""
        t0 = time.monotonic()
        tls: dict[str, object] = {}
        if tunnel_url.startswith("wss://"):
            tls["ssl"] = ssl_context or ssl.create_default_context()
            if server_hostname:
                tls["server_hostname"] = server_hostname
        async with asyncio.timeout(self.timeout_s):
            async with connect(
                tunnel_url,
                additional_headers={"Authorization": f"Bearer {token}"},
                compression=None,
                proxy=None,
                open_timeout=self.timeout_s,
                max_size=wire.DEFAULT_LIMITS.max_message,
                subprotocols=versions.offer(),
                **tls,  # type: ignore[arg-type]
            ) as ws:
                counts = await self._converse(ws, check)
        return counts, (time.monotonic() - t0) * 1000

    async def _converse(self, ws: ClientConnection, check: CanaryCheck) -> dict[str, int]:
        """HELLO, OPEN, one FRAME, its RESULT, CLOSE: the detections per class name."""
        proto = IngestProtocol(versions.accepted(ws.subprotocol))
        hello = (await _next_event(ws, proto, HelloReceived)).hello
        img = await asyncio.to_thread(self.image, hello.input_w, hello.input_h, check.image)
        window = CreditWindow(cap=1)
        await ws.send(proto.open_stream(CANARY_STREAM, window, "none", model=check.model))
        frame = wire.Frame(
            stream_id=CANARY_STREAM, epoch=0, seq=0, pts=0, time_base=(1, 25),
            captured_at=time.time(), src_w=img.src_w, src_h=img.src_h, scale=img.scale,
        )  # fmt: skip
        await ws.send(proto.send_frame(frame, img.data, time.monotonic()))
        result = await _next_event(ws, proto, ResultReceived)
        await ws.send(proto.close_stream(CANARY_STREAM))
        det, names = result.detections, hello.class_names_of(result.result.model_name)
        ids = det.class_id[det.confidence >= check.min_confidence].tolist()
        return dict(Counter(names[i] if 0 <= i < len(names) else str(i) for i in ids))


_E = TypeVar("_E", HelloReceived, ResultReceived)


async def _next_event(ws: ClientConnection, proto: IngestProtocol, kind: type[_E]) -> _E:
    """Read until an event of ``kind``; a worker ERROR for the frame or a protocol
    error raises (the timeout of :meth:`Canary.run` bounds the wait)."""
    while True:
        for event in proto.receive_data(await ws.recv(decode=False), time.monotonic()):
            if isinstance(event, kind):
                return event
            if (why := probe_failure(event)) is None:
                continue
            if isinstance(event, ProtocolViolation):
                await ws.close(event.code, event.reason)
            raise FramerelayError(f"canary: {why}")


class WorkerProber:
    """Heartbeat + capacity over HTTP, canary over the tunnel."""

    def __init__(
        self,
        canary: Canary,
        token_for: TokenFn,
        *,
        heartbeat_timeout_s: float = 2.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``ssl_context`` verifies pods (the orchestrator's CA); None: the system's CAs."""
        self.canary = canary
        self._token_for = token_for
        self._ssl = ssl_context
        self._http = httpx.AsyncClient(timeout=heartbeat_timeout_s, verify=ssl_context or True)

    async def _heartbeat(self, http_url: str, ext: dict[str, str] | None) -> str | None:
        """``/healthz`` (raises when it fails), then ``/readyz``: why the worker is not
        ready (its own words), or None when it is."""
        (await self._http.get(f"{http_url}/healthz", extensions=ext)).raise_for_status()
        resp = await self._http.get(f"{http_url}/readyz", extensions=ext)
        if resp.is_success or resp.status_code == 404:  # 404: a worker without /readyz
            return None
        return f"HTTP {resp.status_code}: {_reason(resp.text) or resp.reason_phrase}"

    async def _info(self, http_url: str, token: str, ext: dict[str, str] | None) -> Probe:
        """What ``/info`` says: the capacity, the loaded models other than the default one
        (to canary) and the worker's models for placement."""
        resp = await self._http.get(
            f"{http_url}/info", headers={"Authorization": f"Bearer {token}"}, extensions=ext
        )
        if resp.status_code in (401, 403):
            raise FramerelayError(
                f"/info refused the orchestrator's token: HTTP {resp.status_code}"
            )
        resp.raise_for_status()
        info = resp.json()
        if not isinstance(info, dict):
            return Probe(alive=True, ready=True)
        return Probe(
            alive=True, ready=True, capacity_fps=_capacity(info.get("capacity_fps")),
            models=loaded_models(info), worker_models=WorkerModels.from_info(info),
            ms_per_inference=_capacity(info.get("ms_per_inference")),
        )  # fmt: skip

    async def probe(
        self, name: str, tunnel_url: str, http_url: str, *, canary: bool,
        tls_name: str | None = None,
    ) -> Probe:  # fmt: skip
        token = self._token_for(name)
        ext = {"sni_hostname": tls_name} if tls_name and http_url.startswith("https://") else None
        try:
            unready = await self._heartbeat(http_url, ext)
            if unready is not None:  # no canary: the worker refuses tunnels while unready
                return Probe(alive=True, ready=False, error=f"worker not ready: {unready}")
            seen = await self._info(http_url, token, ext)
        except FramerelayError as exc:
            return Probe(alive=False, error=f"heartbeat failed: {exc}")
        except (httpx.HTTPError, ValueError) as exc:
            return Probe(alive=False, error=f"heartbeat failed: {describe_http_error(exc)}")
        if not canary:
            return seen
        probe = await self._canary(tunnel_url, token, tls_name, seen.capacity_fps)
        if probe.canary_ok:
            probe = await self._model_canaries(probe, tunnel_url, token, tls_name, seen.models)
        return replace(probe, worker_models=seen.worker_models,
                       ms_per_inference=seen.ms_per_inference)  # fmt: skip

    async def _canary(
        self, tunnel_url: str, token: str, tls_name: str | None, capacity: float
    ) -> Probe:
        try:
            persons, ms = await self.canary.run(
                tunnel_url, token, ssl_context=self._ssl, server_hostname=tls_name
            )
        except (TimeoutError, OSError, WebSocketException, FramerelayError) as exc:
            return Probe(True, False, capacity_fps=capacity, error=_canary_error(exc), ready=True)
        ok = persons >= self.canary.min_persons
        error = (
            None if ok else f"canary saw {persons} persons, expected >= {self.canary.min_persons}"
        )
        return Probe(True, ok, persons, ms, capacity, error, ready=True)

    async def _model_canaries(
        self, probe: Probe, url: str, token: str, tls_name: str | None, models: tuple[str, ...]
    ) -> Probe:
        """Each other loaded model against its own expectation; the first failure fails
        the probe. A model the orchestrator's registry lacks is logged and not checked."""
        for model in models:
            check = self.canary.check_for(model)
            if check is None:
                log.warning("no canary for model %s: not in the orchestrator's registry", model)
                continue
            error = await self.check_model(url, token, check, tls_name)
            if error is not None:
                return replace(probe, canary_ok=False, error=error, models=models)
        return replace(probe, models=models)

    async def check_model(
        self, url: str, token: str, check: CanaryCheck, tls_name: str | None = None
    ) -> str | None:
        """None when ``check``'s model finds what it must on its image; else why not."""
        try:
            counts, _ = await self.canary.run_check(
                url, token, check, ssl_context=self._ssl, server_hostname=tls_name
            )
        except (TimeoutError, OSError, WebSocketException, FramerelayError) as exc:
            return f"model {check.model}: {_canary_error(exc)}"
        return check.shortfall(counts)

    async def aclose(self) -> None:
        await self._http.aclose()


def loaded_models(info: Mapping[str, object]) -> tuple[str, ...]:
    """The loaded models of a worker's ``/info`` other than its default one (a worker
    from before models has none); names that are no model name are skipped."""
    default, models = info.get("default_model"), info.get("models")
    if not isinstance(models, list):
        return ()
    names = (m.get("name") for m in models if isinstance(m, dict) and m.get("loaded") is True)
    return tuple(n for n in names if isinstance(n, str) and n != default and _MODEL.fullmatch(n))[
        :MAX_MODELS
    ]


def _reason(text: str) -> str:
    """A worker's ``/readyz`` body as a one-line reason: printable, at most 200 characters."""
    line = " ".join(text.split())
    return "".join(c for c in line if c.isprintable())[:REASON_CHARS]


def _capacity(value: object) -> float:
    """The capacity a worker reports, if it is a plausible number; else 0 (unknown)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    try:
        fps = float(value)
    except OverflowError:
        return 0.0
    return fps if math.isfinite(fps) and 0 <= fps <= MAX_CAPACITY_FPS else 0.0


def _canary_error(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "canary timed out (inference hung or too slow)"
    if isinstance(exc, InvalidStatus):
        return f"canary refused: HTTP {exc.response.status_code}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"canary TLS verification failed: {exc.verify_message}"
    return f"canary failed: {type(exc).__name__}: {str(exc)[:200]}"


class StatusProber:
    """Trusts the provider's status (simulations, where pods run nothing)."""

    def __init__(self, capacity_fps: float) -> None:
        self.capacity_fps = capacity_fps

    async def probe(
        self, name: str, tunnel_url: str, http_url: str, *, canary: bool,
        tls_name: str | None = None,
    ) -> Probe:  # fmt: skip
        return Probe(True, True if canary else None, capacity_fps=self.capacity_fps, ready=True)
