"""Shared by ``pods``, ``streams`` and ``fleet``: talk to the orchestrator API."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import Any

from framerelay.errors import ConfigError

DEFAULT_URL = "http://127.0.0.1:8090"


def add_url(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=os.environ.get("FRAMERELAY_ORCH_URL", DEFAULT_URL),
        help=f"orchestrator API (env FRAMERELAY_ORCH_URL; default {DEFAULT_URL})",
    )
    p.add_argument("--json", action="store_true", help="print raw JSON")


def call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    import httpx

    try:
        resp = httpx.request(method, args.url.rstrip("/") + path, json=body, timeout=15)
    except httpx.HTTPError as exc:
        raise ConfigError(
            f"cannot reach the orchestrator at {args.url} ({type(exc).__name__}); "
            "is `framerelay orchestrator` running? (--url / FRAMERELAY_ORCH_URL)"
        ) from None
    if resp.status_code >= 400:
        try:
            detail = resp.json().get("detail", resp.text)
        except ValueError:
            detail = resp.text
        raise ConfigError(f"orchestrator said HTTP {resp.status_code}: {detail}")
    return resp.json()


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    cells = [[str(c) for c in header], *[["" if c is None else str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def emit(args: argparse.Namespace, data: Any, text: str) -> int:
    print(json.dumps(data, indent=2) if args.json else text)
    return 0
