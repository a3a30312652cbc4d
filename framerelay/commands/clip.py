"""``framerelay clip``: a clip from recorded segments with the results drawn on."""

from __future__ import annotations

import argparse
from pathlib import Path

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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from framerelay.errors import ConfigError
    from ingest.recording.clip import parse_time, render_clip

    directory = args.dir / args.stream
    if not (directory / "index.json").exists():
        raise ConfigError(f"no recording of stream {args.stream!r} in {args.dir}")
    summary = render_clip(directory, parse_time(args.start), parse_time(args.end), args.out)
    print(
        f"wrote {args.out}: {summary.frames} frames ({summary.frames_with_results} with results, "
        f"{summary.boxes} boxes) from {summary.segments} segment(s), {summary.codec}"
    )
    return 0
