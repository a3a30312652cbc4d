"""The worker process: tunnel server + health/readiness/metrics on one port.

``/v1/tunnel`` is the WebSocket tunnel; the token (``Authorization: Bearer``,
audience ``framerelay-worker``) is checked before the upgrade completes: 401
when missing, malformed, badly signed, expired or for another service, 403
when it does not grant ``worker:<worker_id>``, 429 to a bad token from an
address that failed too often (a valid token is never refused for what others
sent from its address), and 429 to a valid token whose subject had too many
tunnels closed for misbehaving from that address (``max_tunnel_faults``).
Connections are capped in all and per address (503), and one that has not
finished its request head within ``header_timeout_s`` is closed
(:mod:`framerelay.listeners`).

``/healthz`` answers while the process is alive, ``/readyz`` only after a
warm-up inference succeeded and while the inference loop runs (both open):
the watchdog (:mod:`gpu_worker.watchdog`) turns it 503 with the reason when the
loop ended or a batch runs longer than ``inference_stall_s``, and then closes
every tunnel (1011) and refuses new ones (503) until inference moves again;
``/info`` is JSON (worker id,
providers, ``fp16``, ``io_binding`` and ``engine_cache_dir`` (what the detector
really turned on), input size, capacity measured by the warm-up, ``gpus``: the visible
GPUs' NVML readings or why there are none) for a token granting
``worker:<worker_id>``; ``/metrics`` is Prometheus text, open unless
``metrics_auth`` (then ``metrics:read``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus

import numpy as np
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.headers import parse_subprotocol
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from framerelay import wire
from framerelay.auth.guard import FailureLimiter, Throttled, status_of
from framerelay.auth.tokens import Claims
from framerelay.errors import AuthError
from framerelay.geometry import Letterbox
from framerelay.listeners import ConnectionLimiter, ListenerSettings, websockets_connection
from framerelay.model_registry import check_files, load_registry
from framerelay.protocol import NoCommonVersion
from framerelay.protocol import negotiation as versions
from gpu_worker.batcher import Batcher
from gpu_worker.connection import TunnelConnection
from gpu_worker.detectors import Detector, ModelInput, load_detector
from gpu_worker.detectors.base import acceleration_of
from gpu_worker.faults import FaultInjector
from gpu_worker.gpu_stats import read_gpus
from gpu_worker.jpeg_batch import decoder_in_use, stage_decoder
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.model_pool import ModelPool, default_model, detector_loader
from gpu_worker.settings import WorkerSettings
from gpu_worker.trust import server_ssl_context, tunnel_guard
from gpu_worker.volume import SharedVolume
from gpu_worker.watchdog import Watchdog

log = logging.getLogger(__name__)
TUNNEL_PATH = "/v1/tunnel"
READ_CHUNK = 32 * 1024
"""Bytes read from a tunnel's socket per event-loop callback. websockets parses a
whole read at once: 256 KiB (asyncio's default) of tiny garbage frames is ~10k
frames, ~100 ms in one callback; 32 KiB bounds that to ~12 ms, at no cost to
throughput (one more read per 32 KiB)."""


_GPU_PROVIDERS = ("CUDA", "Tensorrt", "ROCM", "torch:cuda")


def batch_limit(settings: WorkerSettings, detector: Detector) -> int:
    """Frames per batch: explicit, or auto (1 on CPU, the detector's max on GPU)."""
    if settings.max_batch:
        return settings.max_batch
    on_gpu = any(p.startswith(_GPU_PROVIDERS) for p in detector.providers)
    return settings.detector.max_batch if on_gpu else 1


def _ok(conn: ServerConnection, body: bytes, content_type: str) -> Response:
    """200 with ``body``; keeps ``Connection: close`` (this server answers one request each)."""
    resp = conn.respond(HTTPStatus.OK, "")
    resp.body = body
    for name, value in (("Content-Type", content_type), ("Content-Length", str(len(body)))):
        del resp.headers[name]  # Headers is a multidict: setting adds
        resp.headers[name] = value
    return resp


def _offered(conn: ServerConnection) -> list[str]:
    """The subprotocols the peer offered in its upgrade request."""
    if conn.request is None:
        return []
    values = conn.request.headers.get_all("Sec-WebSocket-Protocol")
    return [str(name) for value in values for name in parse_subprotocol(value)]


def _select_subprotocol(
    conn: ServerConnection, offered: Sequence[Subprotocol]
) -> Subprotocol | None:
    """The newest common version; none for a peer from before negotiation (v1) and for
    one with no common version (:meth:`Worker._handle` then closes it with the reason)."""
    if not offered:
        return None
    try:
        return versions.subprotocol(versions.select(offered))
    except NoCommonVersion:
        return None


def _peer(conn: ServerConnection) -> str:
    return str(conn.remote_address[0]) if conn.remote_address else "unknown"


def _fault_key(peer: str, claims: Claims) -> str:
    """Misbehaving tunnels are counted per address and verified token subject: a client
    sharing the ingest's address (NAT, same host) cannot get the ingest's tunnels refused."""
    return f"{peer} {claims.sub}"


def listener_limits(settings: WorkerSettings) -> ConnectionLimiter:
    """The tunnel port's connection caps (framerelay.listeners)."""
    limits = ListenerSettings(
        max_connections=settings.max_connections,
        max_connections_per_peer=settings.max_connections_per_peer,
        header_timeout_s=settings.header_timeout_s,
    )
    return ConnectionLimiter(limits, "FRAMERELAY_WORKER")


class Worker:
    """Owns the detector, the batcher and the server; ``run()`` until stopped."""

    def __init__(self, settings: WorkerSettings, detector: Detector | None = None) -> None:
        self.settings = settings
        self.metrics = WorkerMetrics()
        self.guard = tunnel_guard(settings, self.metrics)
        faults, window = settings.max_tunnel_faults or 1, settings.auth_window_s
        self.faults_by_peer = FailureLimiter(faults, window)
        """Tunnels closed for misbehaving, per address and token subject (:func:`_fault_key`):
        past the limit, new ones get 429."""
        self._fault_keys: weakref.WeakKeyDictionary[ServerConnection, str] = (
            weakref.WeakKeyDictionary()
        )
        """Each authenticated tunnel's fault key, from its upgrade request to its handler."""
        self.limiter = listener_limits(settings)
        volume = SharedVolume.from_settings(settings)  # its files only as signed
        self.detector = detector or volume.load_detector(settings.detector, load_detector)
        self._report_detector()
        registry = load_registry(settings.model_registry, volume.read_bytes)
        for missing in check_files(registry):  # on another pod's volume, perhaps: say so
            log.warning("%s (a stream naming it will fail)", missing)
        self.models = ModelPool(
            registry,
            default_model(settings.default_model, self.detector, registry),
            detector_loader(settings.detector, volume),
            budget_mb=settings.vram_budget_mb,
        )
        """The models streams may name; the detector above is the pinned default."""
        self.metrics.watch_models(self.models.info)
        self.decode_pool = ThreadPoolExecutor(settings.decode_threads, thread_name_prefix="jpeg")
        self.batcher = Batcher(
            self.detector,
            self.metrics,
            max_batch=batch_limit(settings, self.detector),
            capacity=settings.queue_capacity,
            batch_wait_ms=settings.batch_wait_ms,
            faults=FaultInjector(settings.test_fault),
            decoder=stage_decoder(settings.jpeg_decoder, self.decode_pool),
        )
        self.warm = False
        self.stopping = False
        self.connections: set[TunnelConnection] = set()
        self.watchdog = Watchdog(
            self.batcher.heartbeat,
            settings.inference_stall_s,
            on_stall=self._on_stall,
            on_recover=self._on_recover,
            on_tick=self.metrics.inference_busy_s.set,
        )
        self.warmup_ms = 0.0
        self.server: Server | None = None
        self.tls = False
        """True once serving ``wss://`` (a certificate from files or from PEM text)."""
        self._batch_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._scope = f"worker:{settings.worker_id}"

    def _report_detector(self) -> None:
        """What the detector really runs on, as info gauges (``/info`` says it too)."""
        for provider in self.detector.providers:
            self.metrics.provider_info.labels(provider).set(1)
        acc = acceleration_of(self.detector)
        self.metrics.detector_info.labels(str(acc.fp16).lower(), str(acc.io_binding).lower()).set(1)

    @property
    def ready(self) -> bool:
        """Warmed up, not stopping, and inference moving."""
        return self.warm and not self.stopping and self.watchdog.reason is None

    @property
    def unready_reason(self) -> str:
        if self.watchdog.reason is not None:
            return self.watchdog.reason
        return "shutting down" if self.stopping else "warming up"

    def _on_stall(self, reason: str) -> None:
        """The watchdog saw inference stop: unready, tell every tunnel why and close it."""
        self.metrics.ready.set(0)
        self.metrics.inference_stalled.set(1)
        close = f"inference stalled for {self.watchdog.busy_s:.1f} s"
        if "loop ended" in reason:
            close = reason
        log.error("%s; closing %d tunnel(s), /readyz 503", reason, len(self.connections))
        for conn in list(self.connections):
            self.metrics.tunnels_closed.labels("stalled").inc()
            task = asyncio.get_running_loop().create_task(conn.close(1011, close))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def _on_recover(self) -> None:
        self.metrics.inference_stalled.set(0)
        self.metrics.ready.set(1 if self.ready else 0)
        log.warning("inference moves again (the stalled batch finished); ready again")

    @property
    def hello(self) -> wire.Hello:
        w, h = self.detector.input_size
        return wire.build(
            wire.Hello,
            worker_id=self.settings.worker_id,
            input_w=w,
            input_h=h,
            class_names=list(self.detector.class_names),
            providers=list(self.detector.providers),
            max_inflight=self.settings.max_inflight,
            features=list(versions.FEATURES),
            models=self.models.hello_models(),
        )

    def warm_up(self) -> float:
        """Blocking: the detector's own preparation (each batch shape it will see), then the
        model a few times on a full batch (``batcher.max_batch`` images); returns the last
        run's ms. Runs on the inference thread. The capacity reported in ``/info`` is that
        batch's frames per second, the rate the worker serves at when loaded."""
        prepare = getattr(self.detector, "prepare", None)
        if callable(prepare):
            prepare()
        w, h = self.detector.input_size
        item = ModelInput(np.full((h, w, 3), 114, np.uint8), Letterbox.fit(w, h, w, h))
        elapsed = 0.0
        for _ in range(self.settings.warmup_runs):
            t0 = time.perf_counter()
            self.detector.infer([item] * self.batcher.max_batch)
            elapsed = (time.perf_counter() - t0) * 1000
        return elapsed

    def _process_request(self, conn: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path == "/healthz":
            return conn.respond(HTTPStatus.OK, "ok\n")
        if path == "/readyz":
            if self.ready:
                return conn.respond(HTTPStatus.OK, "ready\n")
            return conn.respond(HTTPStatus.SERVICE_UNAVAILABLE, f"{self.unready_reason}\n")
        if path == "/info":
            return self._refusal(conn, request, self._scope) or self._info(conn)
        if path == "/metrics":
            if self.settings.metrics_auth:
                denied = self._refusal(conn, request, "metrics:read")
                if denied is not None:
                    return denied
            return _ok(conn, self.metrics.render(), "text/plain; version=0.0.4")
        if path != TUNNEL_PATH:
            return conn.respond(
                HTTPStatus.NOT_FOUND, f"unknown path; the tunnel is {TUNNEL_PATH}\n"
            )
        return self._tunnel_gate(conn, request)

    def _info(self, conn: ServerConnection) -> Response:
        """JSON for the orchestrator: identity and capacity from the warm-up benchmark."""
        w, h = self.detector.input_size
        info = {
            "worker_id": self.settings.worker_id,
            "providers": list(self.detector.providers),
            **acceleration_of(self.detector).as_info(),
            "jpeg_decoder": decoder_in_use(self.batcher.decoder),
            "input_w": w,
            "input_h": h,
            "ready": self.ready,
            "ms_per_inference": round(self.warmup_ms, 3),
            "capacity_batch": self.batcher.max_batch,
            "capacity_fps": self.capacity_fps,
            "gpus": read_gpus().as_info(),
            "default_model": self.models.default.name,
            **self.models.info(),
        }
        return _ok(conn, json.dumps(info).encode(), "application/json")

    def _tunnel_gate(self, conn: ServerConnection, request: Request) -> Response | None:
        """The token first, then whether its subject misbehaved from here, then readiness."""
        claims = self._authorize(conn, request, self._scope)
        if isinstance(claims, Response):
            return claims
        key = _fault_key(_peer(conn), claims)
        refused = self._misbehaving(conn, key) or self._unready(conn)
        if refused is None:
            self._fault_keys[conn] = key
        return refused

    def _refusal(self, conn: ServerConnection, request: Request, scope: str) -> Response | None:
        """None when the bearer token grants ``scope``; else the 401/403/429 answer."""
        claims = self._authorize(conn, request, scope)
        return claims if isinstance(claims, Response) else None

    def _authorize(self, conn: ServerConnection, request: Request, scope: str) -> Claims | Response:
        """The claims of a bearer token granting ``scope``; else the 401/403/429 answer."""
        peer = _peer(conn)
        try:
            return self.guard.check(request.headers.get("Authorization"), scope, peer)
        except AuthError as exc:
            log.warning("refused %s from %s: %s", request.path.split("?", 1)[0], peer, exc)
            resp = conn.respond(HTTPStatus(status_of(exc)), f"{exc}\n")
            resp.headers["WWW-Authenticate"] = 'Bearer realm="framerelay"'
            if isinstance(exc, Throttled):
                resp.headers["Retry-After"] = str(max(1, round(exc.retry_after_s)))
            return resp

    def _misbehaving(self, conn: ServerConnection, key: str) -> Response | None:
        """429 when tunnels of this token subject from this address were closed too often
        for misbehaving."""
        if not self.settings.max_tunnel_faults:
            return None
        retry = self.faults_by_peer.retry_after(key)
        if retry is None:
            return None
        self.metrics.auth_failures.labels("misbehaving").inc()
        resp = conn.respond(
            HTTPStatus.TOO_MANY_REQUESTS,
            f"too many tunnels of this token's subject from this address were closed for "
            f"protocol errors or bad frames; retry in {retry:.0f} s\n",
        )
        resp.headers["Retry-After"] = str(max(1, round(retry)))
        return resp

    def _unready(self, conn: ServerConnection) -> Response | None:
        if not self.ready:
            return conn.respond(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"worker is not ready ({self.unready_reason}); retry\n",
            )
        return None

    @property
    def capacity_fps(self) -> float:
        """Frames/s the warm-up measured: a full batch (``capacity_batch``) per run."""
        if self.warmup_ms <= 0:
            return 0.0
        return round(self.batcher.max_batch * 1000.0 / self.warmup_ms, 2)

    @property
    def scheme(self) -> str:
        return "wss" if self.tls else "ws"

    async def _handle(self, ws: ServerConnection) -> None:
        self.metrics.tunnels.inc()
        if isinstance(getattr(ws.transport, "max_size", None), int):  # asyncio's selector
            ws.transport.max_size = READ_CHUNK  # type: ignore[attr-defined]
        peer = _peer(ws)
        key = self._fault_keys.pop(ws, peer)
        try:
            version = versions.select(_offered(ws))
        except NoCommonVersion as exc:  # accepted without a subprotocol: say why, close
            log.warning("refused a tunnel from %s: %s", peer, exc)
            self.metrics.tunnels_closed.labels("protocol").inc()
            await ws.close(exc.close_code, str(exc))
            return
        conn = TunnelConnection(
            ws, self.settings, self.batcher, self.metrics, self.decode_pool, self.hello,
            version=version, on_fault=lambda: self.faults_by_peer.failed(key),
            models=self.models,
        )  # fmt: skip
        self.connections.add(conn)
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)

    async def start(self) -> tuple[str, int]:
        """Warm up, then listen; returns the bound (host, port)."""
        loop = asyncio.get_running_loop()
        ms = await loop.run_in_executor(self.batcher.inference_thread, self.warm_up)
        self.warmup_ms = ms
        self.warm = True
        self.metrics.ready.set(1)
        on = ",".join(self.detector.providers)
        batch, fps = self.batcher.max_batch, self.capacity_fps
        log.info("warm-up done: %.1f ms per batch of %d on %s (%.0f frames/s)", ms, batch, on, fps)
        ssl_ctx = server_ssl_context(self.settings)
        self.tls = ssl_ctx is not None
        self._batch_task = asyncio.create_task(self.batcher.run(), name="batcher")
        self.watchdog.watch(self._batch_task)
        self._watch_task = asyncio.create_task(self.watchdog.run(), name="watchdog")
        self.server = await serve(
            self._handle,
            self.settings.host,
            self.settings.port,
            ssl=ssl_ctx,
            process_request=self._process_request,
            subprotocols=versions.offer(),
            select_subprotocol=_select_subprotocol,
            compression=None,
            max_size=wire.Limits(max_payload=self.settings.max_message_bytes).max_message,
            max_queue=32,
            create_connection=websockets_connection(self.limiter),
            open_timeout=self.settings.header_timeout_s,
            ping_interval=20,
            ping_timeout=20,
        )
        sock = next(iter(self.server.sockets))
        host, port = sock.getsockname()[:2]
        return str(host), int(port)

    async def serve_forever(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set, then shut down gracefully."""
        if self.server is None:
            await self.start()
        assert self.server is not None and self._batch_task is not None  # noqa: S101
        try:
            await stop.wait()
        finally:
            self.stopping = True
            self.metrics.ready.set(0)
            if self._watch_task is not None:
                self._watch_task.cancel()
            self.server.close(close_connections=True)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.shutdown_timeout_s):
                    await self.server.wait_closed()
            self._batch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._batch_task
            self.decode_pool.shutdown(wait=False, cancel_futures=True)
