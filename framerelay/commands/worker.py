"""``framerelay worker``: run a GPU worker (tunnel server + detector)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from framerelay.commands._types import finite_float
from framerelay.commands.worker_gpus import parse_gpus

log = logging.getLogger("framerelay.worker")
HELP = "run a GPU worker: tunnel server, batched detection, tracking"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "worker",
        help=HELP,
        description=HELP + ". Tunnel tokens verify against the PUBLIC key set in "
        "FRAMERELAY_WORKER_TUNNEL_KEYS[_FILE] ('framerelay keys public'), or HS256 secrets in "
        "FRAMERELAY_TOKEN_SECRETS[_FILE] on a single host; a certificate can also come as PEM "
        "text (FRAMERELAY_WORKER_TLS_CERT_PEM / _TLS_KEY_PEM). Every option but --gpus also "
        "reads FRAMERELAY_WORKER_<NAME>.",
    )
    p.add_argument("--host", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (default 8443; 0 = any free port)")
    p.add_argument("--worker-id", help="id that tunnel tokens must grant (default: hostname)")
    p.add_argument(
        "--model", type=Path, help="detector model (.onnx, or .pt with the ultralytics extra)"
    )
    p.add_argument(
        "--providers", choices=["auto", "tensorrt", "cuda", "cpu"], help="ONNX Runtime providers"
    )
    p.add_argument("--threads", type=int, help="CPU inference threads (0 = ONNX Runtime default)")
    p.add_argument("--max-batch", type=int, help="frames per inference batch (0 = auto)")
    p.add_argument("--confidence", type=finite_float, help="detector confidence threshold")
    p.add_argument("--tracker", help=argparse.SUPPRESS)  # retired: warned about, no effect
    p.add_argument("--tls-cert", type=Path, help="PEM certificate chain (enables wss://)")
    p.add_argument("--tls-key", type=Path, help="PEM private key")
    p.add_argument(
        "--tls-client-ca", type=Path, help="require client certificates from this CA (mTLS)"
    )
    p.add_argument(
        "--announce",
        action="store_true",
        help="print one JSON line on stdout once ready (used by the demo and tests)",
    )
    p.add_argument(
        "--gpus",
        type=parse_gpus,
        metavar="all|N|0,1",
        help="one worker process per GPU, each pinned by CUDA_VISIBLE_DEVICES: 'all' (every "
        "GPU NVML sees), a count N (GPUs 0..N-1) or indexes/GPU-<uuid>s; worker ids "
        "<id>-gpu<i>, ports --port + k (0: each a free port)",
    )
    p.add_argument(
        "--serverless",
        action="store_true",
        help="serve RunPod serverless jobs instead of tunnels (a serverless endpoint's start "
        "command; needs 'pip install runpod'): docs/runpod.md#serverless-mode",
    )
    p.set_defaults(func=run)


_TOP = ("host", "port", "worker_id", "tls_cert", "tls_key", "tls_client_ca", "max_batch")
_DETECTOR = {
    "providers": "providers",
    "threads": "threads",
    "confidence": "confidence_threshold",
}


def build_settings(args: argparse.Namespace) -> Any:
    """Environment first, then command-line options on top."""
    from gpu_worker.detectors import (
        OnnxDetectorSettings,
        UltralyticsDetectorSettings,
        settings_for_model,
    )
    from gpu_worker.settings import WorkerSettings

    top = {k: getattr(args, k) for k in _TOP if getattr(args, k) is not None}
    settings = WorkerSettings(**top)
    det = {
        dst: getattr(args, src) for src, dst in _DETECTOR.items() if getattr(args, src) is not None
    }
    if args.model is None and not det:
        return settings
    current = settings.detector
    model: Path = args.model or current.model
    same_kind = (model.suffix == ".pt") == (current.type == "ultralytics")
    fields = current.model_dump(exclude={"type", "model"}) if same_kind else {}
    fields.update(det)
    kind = UltralyticsDetectorSettings if model.suffix == ".pt" else OnnxDetectorSettings
    fields = {k: v for k, v in fields.items() if k in kind.model_fields}  # e.g. no ORT threads
    return settings.model_copy(update={"detector": settings_for_model(model, **fields)})


def run(args: argparse.Namespace) -> int:
    settings = build_settings(args)
    if args.serverless:
        from gpu_worker.serverless import serve_runpod

        return serve_runpod(settings)
    if args.gpus is not None:  # a supervisor of one worker per GPU, each warned on its own
        from framerelay.commands.worker_gpus import run_per_gpu

        return run_per_gpu(args, settings.worker_id, settings.port, settings.shutdown_timeout_s)
    for warning in startup_warnings(args, os.environ):
        log.warning("%s", warning)
    return asyncio.run(_serve(settings, args.announce))


def startup_warnings(args: argparse.Namespace, environ: Mapping[str, str]) -> list[str]:
    """Ignored environment names and retired options (names only, never values)."""
    from gpu_worker.settings import RETIRED, env_warnings

    out = env_warnings(environ)
    if args.tracker is not None:
        out.append(
            f"ignoring --tracker: retired, it has no effect: {RETIRED['FRAMERELAY_WORKER_TRACKER']}"
        )
    return out


async def _serve(settings: Any, announce: bool) -> int:
    from framerelay.lifecycle import install_signal_handlers, startup_heap_frozen
    from framerelay.startup import announce_ready, bind_error, check_port, print_ready_json
    from gpu_worker.server import TUNNEL_PATH, Worker

    where = "--port / FRAMERELAY_WORKER_PORT"
    check_port(settings.host, settings.port, where)  # before a warm-up of minutes
    worker = _load(Worker, settings)
    stop = asyncio.Event()
    install_signal_handlers(stop)
    try:
        host, port = await worker.start()
    except OSError as exc:
        raise bind_error(exc, settings.host, settings.port, where) from None
    info = {
        "event": "ready",
        "url": f"{worker.scheme}://{host}:{port}{TUNNEL_PATH}",
        "worker_id": settings.worker_id,
        "pid": os.getpid(),
        "providers": list(worker.detector.providers),
    }
    if announce:
        print_ready_json(info)
    model = settings.detector.model
    announce_ready(
        f"worker {settings.worker_id}",
        info["url"],
        f"model {model.name} on {', '.join(info['providers'])} (warm-up "
        f"{worker.warmup_ms:.0f} ms per inference)",
    )
    with startup_heap_frozen():
        await worker.serve_forever(stop)
    return 0


def _load(worker_cls: Any, settings: Any) -> Any:
    """The worker with its model loaded; ConfigError (one line) when the model cannot load."""
    from framerelay.errors import ModelError

    try:
        return worker_cls(settings)
    except ModelError as exc:
        said = str(exc)
        if "cannot load the model" not in said:
            said = f"cannot load the model {settings.detector.model}: {said}"
        raise ModelError(said) from None
