"""``framerelay demo``: the whole pipeline on this machine, embedded defaults.

Starts a local GPU-worker process (CPU is fine), an ingest for the sample clip
(or ``--source``), prints a live progress line and a summary table, and can
write every result to ``--out`` as JSON Lines. No Redis, no GPU needed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from framerelay.commands._types import finite_float
from framerelay.data import DEFAULT_CLIP, DEFAULT_MODEL

HELP = "run the whole pipeline locally on a sample clip (no Redis, no GPU needed)"
CONNECT_TIMEOUT_S = 60.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help=HELP, description=HELP)
    p.add_argument(
        "--source",
        default=str(DEFAULT_CLIP),
        help="file or URL PyAV can open (default: the TUD-Stadtmitte sample)",
    )
    p.add_argument(
        "--streams", type=int, default=1, help="run the source N times as separate streams"
    )
    p.add_argument(
        "--max-frames", type=int, default=0, help="stop each stream after N decoded frames"
    )
    p.add_argument(
        "--fps", type=finite_float, default=0.0, help="sampling target by PTS; 0 = every frame"
    )
    p.add_argument("--out", type=Path, help="write every result as JSON Lines to this file")
    p.add_argument(
        "--realtime",
        action="store_true",
        help="pace the source like a live camera; drop (newest wins) when the worker is busy",
    )
    p.add_argument("--loop", action="store_true", help="loop the source (new epoch each pass)")
    p.add_argument(
        "--duration",
        type=finite_float,
        default=0.0,
        help="stop after this many seconds (0 = at the end)",
    )
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="detector model")
    p.add_argument("--tracker", default="default", help="tracker name")
    p.add_argument(
        "--threads", type=int, default=0, help="worker CPU inference threads (0 = default)"
    )
    p.add_argument("--max-batch", type=int, default=0, help="worker batch limit (0 = default)")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument(
        "--console-port",
        type=int,
        default=8080,
        help="serve the operator console at http://127.0.0.1:PORT/console "
        "(0 = any free port; a taken port falls back to a free one)",
    )
    p.add_argument("--no-console", action="store_true", help="do not serve the console")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from framerelay.errors import ConfigError
    from framerelay.launcher import LocalWorker

    if args.streams < 1:
        raise ConfigError("--streams must be at least 1")
    if "://" not in args.source and not Path(args.source).exists():
        raise ConfigError(f"--source {args.source} does not exist")
    check_args(args)  # every mistake refused before a worker starts
    secret = secrets.token_urlsafe(32)
    worker_args = ["--model", str(args.model), "--threads", str(args.threads)]
    if args.max_batch:
        worker_args += ["--max-batch", str(args.max_batch)]
    _say(f"starting a local worker ({args.model.name}) ...")
    worker = LocalWorker(secret, worker_id="demo-worker", args=worker_args, remove_log=True)
    try:
        with worker:
            _say(f"worker ready at {worker.url} on {', '.join(worker.info['providers'])}")
            return asyncio.run(_run_ingest(args, worker.url, secret))
    finally:
        if worker.log_path.exists():  # kept: the worker did not exit cleanly
            _say(f"the worker's log: {worker.log_path}")


def check_args(args: argparse.Namespace) -> None:
    """ConfigError (one line) for any option the worker or the ingest would refuse."""
    from pydantic import ValidationError

    from framerelay.errors import ConfigError
    from framerelay.settings import describe_invalid
    from tracker.base import available_trackers

    known = available_trackers()
    if args.tracker not in known:
        raise ConfigError(
            f"--tracker {args.tracker!r} is unknown; choose one of {', '.join(known)}"
        )
    if not Path(args.model).is_file():
        raise ConfigError(f"--model {args.model}: cannot load the model: no such file")
    for name, value, high in (
        ("--threads", args.threads, 256),
        ("--max-batch", args.max_batch, 256),
    ):
        if not 0 <= value <= high:
            raise ConfigError(f"{name} must be between 0 and {high} (0 = default), not {value}")
    if not 0 <= args.console_port <= 65535:
        raise ConfigError(
            f"--console-port must be between 0 and 65535 (0 = any free port), not "
            f"{args.console_port}"
        )
    try:
        _settings(args, "ws://127.0.0.1:1/v1/tunnel", "check")  # the streams' own rules
    except ValidationError as exc:
        raise ConfigError(_as_options(describe_invalid(exc))) from None


def _as_options(said: str) -> str:
    """``invalid StreamConfig: fps: ...`` as ``--fps: ...`` (the demo's options)."""
    said = said.removeprefix("invalid StreamConfig: ").removeprefix("invalid IngestSettings: ")
    for field in ("fps", "max_frames", "tracker", "url"):
        option = "--source" if field == "url" else "--" + field.replace("_", "-")
        said = said.replace(f"{field}: ", f"{option}: ", 1) if said.startswith(field) else said
    return said


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _settings(args: argparse.Namespace, url: str, secret: str) -> Any:
    from ingest.settings import IngestSettings, StreamConfig

    streams = [
        StreamConfig(
            id=f"demo-{i + 1}",
            url=args.source,
            fps=args.fps,
            realtime=args.realtime,
            loop=args.loop,
            max_frames=args.max_frames,
            tracker=args.tracker,
        )
        for i in range(args.streams)
    ]
    return IngestSettings(
        worker_url=url,
        token_secrets=secret,
        worker_id="demo-worker",
        streams=streams,
        out=args.out,
        file_roots=[DEFAULT_CLIP.resolve().parent],  # the console may add the sample clip
    )


async def _run_ingest(args: argparse.Namespace, url: str, secret: str) -> int:
    from framerelay.commands.demo_console import serving_console
    from framerelay.lifecycle import install_signal_handlers
    from framerelay.results import ResultRecord
    from ingest.jsonl import JsonlWriter
    from ingest.service import IngestService
    from ingest.stats import Progress, summary_table

    service = IngestService(_settings(args, url, secret))
    objects: dict[str, int] = {}

    def count(record: ResultRecord) -> None:
        objects[record.stream_id] = objects.get(record.stream_id, 0) + len(record.detections)

    service.bus.tap(count)
    writer = JsonlWriter(args.out) if args.out else None
    if writer is not None:
        service.bus.tap(writer.write)
    stop = asyncio.Event()
    # Ctrl-C and SIGTERM end the demo as its end would: the summary, the console token
    # removed, the worker stopped; also where SIGINT came ignored (a script's `cmd &`)
    install_signal_handlers(stop)
    started = time.monotonic()
    watcher = asyncio.create_task(_watch(service, stop, args, Progress()))
    try:
        async with contextlib.AsyncExitStack() as console:
            if not args.no_console:
                await console.enter_async_context(serving_console(service, secret,
                                                                  args.console_port))  # fmt: skip
            await service.run(stop, until_finished=True)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        if writer is not None:
            writer.close()
    elapsed = time.monotonic() - started
    streams = list(service.streams.values())
    _say("")
    print(summary_table(streams, elapsed, objects), flush=True)
    if writer is not None:
        _say(f"wrote {writer.written} results to {args.out}")
    return _exit_code(service)


def _exit_code(service: Any) -> int:
    if service.client.connects == 0:
        _say(f"error: could not connect to the worker: {service.client.last_error}")
        return 1
    failed = [s for s in service.streams.values() if s.error]
    for s in failed:
        _say(f"error: stream {s.id} failed: {s.error}")
    return 1 if failed else 0


async def _watch(
    service: Any, stop: asyncio.Event, args: argparse.Namespace, progress: Any
) -> None:
    """Progress line every second; enforce --duration and the connect timeout."""
    tty = sys.stderr.isatty()
    started = time.monotonic()
    while not stop.is_set():
        await asyncio.sleep(1.0)
        elapsed = time.monotonic() - started
        if not args.quiet:
            line = progress.line(list(service.streams.values()))
            print(
                ("\r" + line) if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True
            )
        if args.duration and elapsed >= args.duration:
            stop.set()
        if service.client.connects == 0 and elapsed > CONNECT_TIMEOUT_S:
            stop.set()
