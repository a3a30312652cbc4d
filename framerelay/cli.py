"""``framerelay``: the command line entry point.

Every failure ends in one line on stderr (``framerelay: error: ...``) and an
exit code: 2 for a wrong argument or setting (argparse's usage errors too), 1
for anything else. A traceback is printed only with ``--log-level DEBUG``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, cast

from pydantic import ValidationError

from framerelay import __version__
from framerelay.commands import COMMAND_MODULES, load
from framerelay.errors import FramerelayError
from framerelay.logging_setup import add_to_every_parser, configure, resolve

USAGE_ERROR = 2
FAILURE = 1
log = logging.getLogger("framerelay")


class Parser(argparse.ArgumentParser):
    """argparse with its usage errors in one line (the usage is one ``--help`` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="framerelay",
        description="Cross-cloud, real-time video inference pipeline.",
    )
    parser.add_argument("--version", action="version", version=f"framerelay {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        module = load(name)
        if module is None:
            continue
        register = cast("Callable[[Any], None]", module.register)  # type: ignore[attr-defined]
        register(sub)
    add_to_every_parser(parser)
    return parser


def _fail(message: str, code: int) -> int:
    print(f"framerelay: error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level, fmt, problem = resolve(args)
    configure(level, fmt)
    if problem is not None:
        return _fail(problem, USAGE_ERROR)
    func = cast(Callable[[argparse.Namespace], int], args.func)
    try:
        return func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # one line for every failure; the traceback only at DEBUG
        log.debug("%s failed", args.command, exc_info=exc)
        return _fail(*describe(exc))


def describe(exc: Exception) -> tuple[str, int]:
    """The one line to print for ``exc`` and the exit code."""
    from framerelay.settings import describe_invalid, settings_error

    if isinstance(exc, FramerelayError):  # ConfigError and its kin: what to change
        return str(exc), USAGE_ERROR
    if isinstance(exc, ValidationError):  # bad settings: where and why, never the values
        return describe_invalid(exc), USAGE_ERROR
    said = settings_error(exc)
    if said is not None:
        return said, USAGE_ERROR
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where}", FAILURE
    return (
        f"unexpected {type(exc).__name__}: {exc} (run with --log-level DEBUG for details)",
        FAILURE,
    )


if __name__ == "__main__":
    raise SystemExit(main())
