"""``framerelay record``: the recording worker (segments + PTS-aligned sidecars)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from framerelay.commands._types import finite_float

HELP = "record a camera into MP4 segments with a PTS-aligned sidecar of its results"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "record",
        help=HELP,
        description=HELP + ". Redis comes from FRAMERELAY_REDIS_URL; every option also reads "
        "FRAMERELAY_RECORD_<NAME>.",
    )
    p.add_argument("--stream", dest="stream_id", help="stream id whose results to align")
    p.add_argument("--source", help="camera URL or file to record (what the ingest reads)")
    p.add_argument("--out", dest="out_dir", type=Path, help="recordings folder")
    p.add_argument("--segment-s", type=finite_float, help="segment length in seconds")
    p.add_argument("--retention-s", type=finite_float, help="delete segments older than this")
    p.add_argument("--max-bytes", type=int, help="keep at most this many bytes")
    p.add_argument("--group", help="Redis consumer group (default recorder)")
    p.add_argument("--consumer", help="consumer name (default record-<stream>)")
    p.add_argument(
        "--realtime",
        action=argparse.BooleanOptionalAction,
        help="read a local file at its frame rate, as the ingest's --realtime (default on)",
    )
    p.add_argument(
        "--loop",
        action=argparse.BooleanOptionalAction,
        help="start a local file over at its end, as the ingest's --loop (default: record it "
        "once, then stop)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from framerelay.errors import ConfigError
    from ingest.recording.settings import RecorderSettings

    keys = ("stream_id", "source", "out_dir", "segment_s", "retention_s", "max_bytes", "group",
            "consumer", "realtime", "loop")  # fmt: skip
    over: dict[str, Any] = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
    try:
        settings = RecorderSettings(**over)
    except ValidationError as exc:
        from framerelay.settings import describe_invalid

        raise ConfigError(describe_invalid(exc)) from None
    if settings.is_file and not Path(settings.source.removeprefix("file://")).is_file():
        raise ConfigError(f"--source {settings.source}: no such file")
    return asyncio.run(_record(settings))


async def _record(settings: Any) -> int:
    from framerelay.lifecycle import install_signal_handlers
    from ingest.recording.recorder import Recorder

    stop = asyncio.Event()
    install_signal_handlers(stop)
    recorder = Recorder(settings)
    await recorder.run(stop)
    print(json.dumps(recorder.describe()), file=sys.stderr, flush=True)
    if recorder.source_error is not None:
        print(f"framerelay: error: cannot record {settings.source}: {recorder.source_error}",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0
