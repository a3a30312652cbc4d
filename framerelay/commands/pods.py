"""``framerelay pods list|add|remove|show``: the orchestrator's GPU pods.

``ls``, ``create`` and ``terminate`` (or ``rm``) are kept as aliases.
"""

from __future__ import annotations

import argparse
from typing import Any

from framerelay.commands._orch_client import add_url, call, emit, table
from framerelay.errors import ConfigError

HELP = "list, add, remove or show GPU worker pods (via the orchestrator)"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("pods", help=HELP, description=HELP)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    ls = verbs.add_parser("list", aliases=["ls"], help="pods with state, health, cost, streams")
    add_url(ls)
    ls.set_defaults(func=_list)
    mk = verbs.add_parser("add", aliases=["create"], help="one more warm pod in a tier")
    mk.add_argument("--tier", required=True)
    add_url(mk)
    mk.set_defaults(func=_create)
    rm = verbs.add_parser("remove", aliases=["terminate", "rm"], help="terminate a pod now")
    rm.add_argument("name")
    add_url(rm)
    rm.set_defaults(func=_terminate)
    show = verbs.add_parser("show", help="one pod: state, health, cost and streams")
    show.add_argument("name")
    add_url(show)
    show.set_defaults(func=_show)


def _list(args: argparse.Namespace) -> int:
    pods = call(args, "GET", "/v1/pods")
    rows = [
        (p["name"], p["tier"], "spot" if p["spot"] else "on-demand", p["state"],
         "yes" if p["ready"] else "no", p["gpu_type"], f"{p['cost_per_hr']:.3f}",
         f"{p['capacity_fps']:.0f}", p.get("region") or "-", _ms(p.get("rtt_ms")),
         _ms(p.get("processing_ms")), len(p["streams"]), p.get("last_error") or "")
        for p in pods
    ]  # fmt: skip
    header = ("POD", "TIER", "KIND", "STATE", "READY", "GPU", "$/H", "CAP FPS", "REGION",
              "RTT MS", "PROC MS", "STREAMS", "ERROR")  # fmt: skip
    return emit(args, pods, table(rows, header))


def _ms(value: object) -> str:
    """A round trip or processing time (ms) for the table; '-' when not measured."""
    return f"{value:.1f}" if isinstance(value, int | float) else "-"


def _create(args: argparse.Namespace) -> int:
    out = call(args, "POST", "/v1/pods", {"tier": args.tier})
    return emit(args, out, f"tier {out['tier']}: floor now {out['floor']} ({out['note']})")


def _terminate(args: argparse.Namespace) -> int:
    out = call(args, "DELETE", f"/v1/pods/{args.name}")
    return emit(args, out, f"terminated {out['terminated']}")


def _show(args: argparse.Namespace) -> int:
    pods: list[dict[str, Any]] = call(args, "GET", "/v1/pods")
    found = next((p for p in pods if p["name"] == args.name), None)
    if found is None:
        known = ", ".join(sorted(p["name"] for p in pods)) or "none"
        raise ConfigError(f"no pod {args.name!r} on the orchestrator (pods: {known})")
    text = "\n".join(f"{k}: {'-' if v is None else v}" for k, v in found.items())
    return emit(args, found, text)
