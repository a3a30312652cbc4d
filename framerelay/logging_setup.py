"""Logging for every ``framerelay`` command: level and format from flags or env.

``--log-level`` (``FRAMERELAY_LOG_LEVEL``) and ``--log-format``
(``FRAMERELAY_LOG_FORMAT``: ``text`` or ``json``) are accepted by every
command, before or after the sub-command. ``json`` writes one JSON object per
line (``ts``, ``level``, ``logger``, ``msg``, and ``exc`` for a traceback), for
log collectors. The HTTP client libraries (httpx, httpcore) log one INFO line
per request: they are kept at WARNING unless the level is DEBUG.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
from collections.abc import Mapping

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("text", "json")
LEVEL_ENV = "FRAMERELAY_LOG_LEVEL"
FORMAT_ENV = "FRAMERELAY_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CHATTY = ("httpx", "httpcore")
"""Libraries that log every request at INFO: WARNING unless DEBUG."""

_LEVEL_OPT = "--log-level"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts (UTC, ISO 8601), level, logger, msg[, exc]."""

    def format(self, record: logging.LogRecord) -> str:
        ts = dt.datetime.fromtimestamp(record.created, dt.UTC)
        out: dict[str, object] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def _level(value: str) -> str:
    level = value.strip().upper()
    if level not in LEVELS:
        raise argparse.ArgumentTypeError(f"{value!r}: choose one of {', '.join(LEVELS)}")
    return level


def _format(value: str) -> str:
    fmt = value.strip().lower()
    if fmt not in FORMATS:
        raise argparse.ArgumentTypeError(f"{value!r}: choose one of {', '.join(FORMATS)}")
    return fmt


def add_logging_options(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` and ``--log-format`` on ``parser`` (absent: the env, then defaults).

    ``SUPPRESS`` defaults, so a sub-command's parser never overwrites a value
    given before the sub-command.
    """
    group = parser.add_argument_group("logging")
    group.add_argument(
        _LEVEL_OPT,
        type=_level,
        default=argparse.SUPPRESS,
        metavar="LEVEL",
        help=f"{', '.join(LEVELS)} (env {LEVEL_ENV}; default INFO)",
    )
    group.add_argument(
        "--log-format",
        type=_format,
        default=argparse.SUPPRESS,
        metavar="FORMAT",
        help=f"text or json: one JSON object per line (env {FORMAT_ENV}; default text)",
    )


def add_to_every_parser(parser: argparse.ArgumentParser) -> None:
    """The logging options on ``parser`` and on every sub-command's parser below it."""
    seen: set[int] = set()
    todo = [parser]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue  # an alias names the same parser twice
        seen.add(id(current))
        if not any(_LEVEL_OPT in a.option_strings for a in current._actions):
            add_logging_options(current)
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())


def resolve(
    args: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> tuple[str, str, str | None]:
    """(level, format, problem): flags, then env, then INFO/text; a bad env value is the
    problem (the default is used meanwhile)."""
    problem = None
    level = getattr(args, "log_level", None)
    fmt = getattr(args, "log_format", None)
    try:
        level = level or _level(environ.get(LEVEL_ENV) or "INFO")
    except argparse.ArgumentTypeError as exc:
        level, problem = "INFO", f"{LEVEL_ENV}={exc}"
    try:
        fmt = fmt or _format(environ.get(FORMAT_ENV) or "text")
    except argparse.ArgumentTypeError as exc:
        fmt, problem = "text", f"{FORMAT_ENV}={exc}"
    return level, fmt, problem


def configure(level: str, fmt: str) -> None:
    """Root handler on stderr in ``fmt`` at ``level``; quiet HTTP clients unless DEBUG."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    quiet = logging.NOTSET if level == "DEBUG" else logging.WARNING
    for name in CHATTY:
        logging.getLogger(name).setLevel(quiet)
