"""``framerelay ingest``: run the ingest service against a worker."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

from framerelay.commands._types import finite_float

HELP = "run the ingest service: decode streams, send them to a worker, serve results"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "ingest",
        help=HELP,
        description=HELP + ". Keys come from FRAMERELAY_SIGNING_KEYS_FILE (a key set from "
        "'framerelay keys generate'; it mints tunnel tokens and verifies API tokens) or, on one "
        "host, FRAMERELAY_TOKEN_SECRETS; a fixed tunnel token from FRAMERELAY_INGEST_TOKEN. "
        "Every option also reads FRAMERELAY_INGEST_<NAME>.",
    )
    p.add_argument("--worker-url", help="ws(s)://host:port/v1/tunnel of the worker")
    p.add_argument("--worker-id", help="worker id a locally minted token is scoped to")
    p.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="URL",
        help="a stream to read (repeatable); ids are stream-1, stream-2, ...",
    )
    p.add_argument("--streams-file", type=Path, help="JSON list of stream definitions")
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="cameras file (.yaml/.yml, .toml or .json): a 'streams' list of the definitions "
        "POST /v1/streams takes, optional 'defaults'; with --source/--streams-file it replaces "
        "FRAMERELAY_INGEST_STREAMS, and a definition stored over the API wins over it",
    )
    p.add_argument(
        "--fps", type=finite_float, default=5.0, help="sampling target for --source streams"
    )
    p.add_argument("--realtime", action="store_true", help="pace files like live cameras")
    p.add_argument("--loop", action="store_true", help="loop file sources")
    p.add_argument(
        "--latency-slo-ms",
        type=finite_float,
        metavar="MS",
        help="latency objective of --source streams (results later than this count as breaches)",
    )
    p.add_argument("--tls-ca", type=Path, help="CA bundle to verify the worker")
    p.add_argument("--tls-client-cert", type=Path, help="client certificate (mTLS)")
    p.add_argument("--tls-client-key", type=Path, help="client key (mTLS)")
    p.add_argument("--api-host", help="results API address (default 127.0.0.1)")
    p.add_argument("--api-port", type=int, help="results API port (default 8080)")
    p.add_argument("--api-tls-cert", type=Path, help="serve the API over HTTPS/WSS with this cert")
    p.add_argument("--api-tls-key", type=Path, help="private key of --api-tls-cert")
    p.add_argument("--api-tls-client-ca", type=Path, help="mTLS: API clients' CA")
    p.add_argument("--out", type=Path, help="also append results to this JSON Lines file")
    p.add_argument(
        "--shard",
        action="store_true",
        help="share the streams with the other ingest replicas on FRAMERELAY_REDIS_URL "
        "(leases; a dead replica's streams are taken over)",
    )
    p.add_argument("--replica-id", help="this replica's id (default: host-pid-random)")
    p.set_defaults(func=run)


def build_settings(args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from framerelay.errors import ConfigError

    try:
        return _build_settings(args)
    except ValidationError as exc:
        from framerelay.settings import describe_invalid

        raise ConfigError(describe_invalid(exc)) from None


def _build_settings(args: argparse.Namespace) -> Any:
    from ingest.settings import IngestSettings, StreamConfig

    keys = (
        "worker_url",
        "worker_id",
        "tls_ca",
        "tls_client_cert",
        "tls_client_key",
        "api_host",
        "api_port",
        "api_tls_cert",
        "api_tls_key",
        "api_tls_client_ca",
        "out",
    )
    over: dict[str, Any] = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
    shards = {"enabled": True} if getattr(args, "shard", False) else {}
    if getattr(args, "replica_id", None) is not None:
        shards["replica_id"] = args.replica_id
    if shards:
        over["shards"] = shards
    streams = [
        StreamConfig(
            id=f"stream-{i + 1}",
            url=url,
            fps=args.fps,
            realtime=args.realtime,
            loop=args.loop,
            latency_slo_ms=args.latency_slo_ms,
        )
        for i, url in enumerate(args.source)
    ]
    groups = {"--source": streams}
    if args.streams_file is not None:
        groups[f"--streams-file {args.streams_file}"] = read_streams_file(args.streams_file)
    if args.config is not None:
        from ingest.config_file import load_streams

        groups[f"--config {args.config}"] = load_streams(args.config, os.environ)
    streams = _unique_ids(groups)
    if streams:
        over["streams"] = streams
    return IngestSettings(**over)


def _unique_ids(groups: dict[str, list[Any]]) -> list[Any]:
    """The streams of every option, in order; ConfigError when two options give one id."""
    from framerelay.errors import ConfigError

    first: dict[str, str] = {}
    for option, configs in groups.items():
        for cfg in configs:
            if cfg.id in first:
                raise ConfigError(
                    f"stream id {cfg.id} is given twice ({first[cfg.id]} and {option}; "
                    "--source streams are stream-1, stream-2, ...): ids must be unique"
                )
            first[cfg.id] = option
    return [cfg for configs in groups.values() for cfg in configs]


def read_streams_file(path: Path) -> list[Any]:
    """The stream definitions in a JSON file; ConfigError naming the file and the stream."""
    from ingest.config_file import load_streams

    return load_streams(path, os.environ, option="--streams-file", format_="JSON", list_only=True)


def run(args: argparse.Namespace) -> int:
    settings = build_settings(args)  # a bad setting or camera file fails before the heavy imports
    from ingest.app import serve_ingest

    return asyncio.run(serve_ingest(settings))
