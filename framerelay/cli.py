"""``framerelay``: the command line entry point."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any, cast

from pydantic import ValidationError

from framerelay import __version__
from framerelay.commands import COMMAND_MODULES, load
from framerelay.errors import FramerelayError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="framerelay",
        description="Cross-cloud, real-time video inference pipeline.",
    )
    parser.add_argument("--version", action="version", version=f"framerelay {__version__}")
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        module = load(name)
        if module is None:
            continue
        register = cast("Callable[[Any], None]", module.register)  # type: ignore[attr-defined]
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    func = cast(Callable[[argparse.Namespace], int], args.func)
    try:
        return func(args)
    except FramerelayError as exc:
        print(f"framerelay: error: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:  # bad settings: where and why, never the values given
        from framerelay.settings import describe_invalid

        print(f"framerelay: error: {describe_invalid(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
