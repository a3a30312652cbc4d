"""``framerelay clip``: a clip from recorded segments with the results drawn on."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from framerelay.commands._types import finite_float

HELP = "render a clip from recorded segments with boxes, track ids and labels drawn"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("clip", help=HELP, description=HELP + " (from the sidecars).")
    p.add_argument("--stream", required=True, help="stream id (a folder of the recordings)")
    p.add_argument("--start", required=True, help="Unix seconds or ISO 8601 (UTC by default)")
    p.add_argument("--end", required=True, help="Unix seconds or ISO 8601")
    p.add_argument("--out", type=Path, required=True, help="the clip to write (.mp4)")
    p.add_argument(
        "--dir", type=Path, default=Path("recordings"), help="recordings folder (--out of record)"
    )
    p.add_argument(
        "--hold-s",
        type=finite_float,
        help="keep a track's box this long without a new result for it (default: twice the "
        "interval between results; 0: each box on its own frame only)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import math

    from framerelay.errors import ConfigError
    from ingest.recording.clip import ClipError, parse_time, render_clip

    hold_s: float | None = args.hold_s
    if hold_s is not None and not (math.isfinite(hold_s) and hold_s >= 0):
        raise ConfigError(f"--hold-s must be a number of seconds >= 0, got {hold_s}")
    start, end = parse_time(args.start), parse_time(args.end)
    directory = args.dir / args.stream
    try:
        if not (directory / "index.json").is_file():
            raise ClipError(f"no recording of stream {args.stream!r} in {args.dir}")
        summary = render_clip(directory, start, end, args.out, hold_s=hold_s)
    except ClipError as exc:  # the arguments were fine; the recording or the disk was not
        print(f"framerelay: error: {exc}", file=sys.stderr)
        return 1
    print(
        f"wrote {args.out}: {summary.frames} frames ({summary.frames_with_results} with results, "
        f"{summary.boxes} boxes, held {summary.hold_s:.2f} s) from {summary.segments} "
        f"segment(s), {summary.codec}"
    )
    return 0
