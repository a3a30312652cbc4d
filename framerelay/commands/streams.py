"""``framerelay streams list|add|remove|show|move``: streams the orchestrator places.

``ls`` and ``rm`` are kept as aliases of ``list`` and ``remove``.
"""

from __future__ import annotations

import argparse
from typing import Any

from framerelay.commands._orch_client import add_url, call, emit, table
from framerelay.commands._types import finite_float
from framerelay.errors import ConfigError

HELP = "declare, remove, list, show or move streams (via the orchestrator)"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("streams", help=HELP, description=HELP)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    ls = verbs.add_parser("list", aliases=["ls"], help="streams and where they run")
    add_url(ls)
    ls.set_defaults(func=_list)
    add = verbs.add_parser("add", help="declare a stream")
    add.add_argument("id")
    # dest "source": "url" is --url's, the orchestrator's address (they once shared it)
    add.add_argument("source", metavar="URL", help="camera or file URL the ingest opens")
    add.add_argument("--priority", choices=["critical", "standard", "batch"], default="standard")
    add.add_argument("--fps", type=finite_float, default=5.0)
    add.add_argument("--model", default="yolox_nano")
    add.add_argument("--tracker", default="default")
    add.add_argument("--loop", action="store_true", help="loop a file source")
    add.add_argument("--latency-slo-ms", type=finite_float, metavar="MS", help="latency objective")
    lost = "drop a track unmatched this long (the tracker's default: 1)"
    gap = "bridge an outage (a move to another worker) up to this long (default 10)"
    add.add_argument("--max-lost-s", type=finite_float, metavar="S", help=lost)
    add.add_argument("--max-gap-s", type=finite_float, metavar="S", help=gap)
    add_url(add)
    add.set_defaults(func=_add)
    rm = verbs.add_parser("remove", aliases=["rm"], help="remove a stream")
    rm.add_argument("id")
    add_url(rm)
    rm.set_defaults(func=_remove)
    show = verbs.add_parser("show", help="one stream: its definition and where it runs")
    show.add_argument("id")
    add_url(show)
    show.set_defaults(func=_show)
    mv = verbs.add_parser("move", help="move a stream to a worker (its tracks continue)")
    mv.add_argument("id")
    mv.add_argument("worker")
    add_url(mv)
    mv.set_defaults(func=_move)


def _add(args: argparse.Namespace) -> int:
    body = {
        "id": args.id, "url": args.source, "priority": args.priority, "fps": args.fps,
        "model": args.model, "tracker": args.tracker, "loop": args.loop,
    }  # fmt: skip
    if args.latency_slo_ms is not None:
        body["latency_slo_ms"] = args.latency_slo_ms
    times = {"max_lost_s": args.max_lost_s, "max_gap_s": args.max_gap_s}
    if any(v is not None for v in times.values()):
        body["tracker_settings"] = {k: v for k, v in times.items() if v is not None}
    out = call(args, "POST", "/v1/streams", body)
    return emit(args, out, f"added {out['id']} ({out['priority']}, {out['fps']} fps)")


def _remove(args: argparse.Namespace) -> int:
    out = call(args, "DELETE", f"/v1/streams/{args.id}")
    return emit(args, out, f"removed {out['removed']}")


def _list(args: argparse.Namespace) -> int:
    streams = call(args, "GET", "/v1/streams")
    rows = [(s["id"], s["priority"], s["fps"], s["model"], s["worker"] or "-", _slo(s))
            for s in streams]  # fmt: skip
    header = ("STREAM", "PRIORITY", "FPS", "MODEL", "WORKER", "LATENCY SLO")
    return emit(args, streams, table(rows, header))


def _slo(stream: dict[str, Any]) -> str:
    """The stream's latency budget and, placed over it, the expected latency."""
    slo, breach = stream.get("latency_slo_ms"), stream.get("slo_breach")
    if slo is None:
        return "-"
    if isinstance(breach, dict):
        return f"{slo:g} ms: BREACH, {breach.get('expected_ms')} ms expected"
    return f"{slo:g} ms"


def _show(args: argparse.Namespace) -> int:
    streams: list[dict[str, Any]] = call(args, "GET", "/v1/streams")
    found = next((s for s in streams if s["id"] == args.id), None)
    if found is None:
        known = ", ".join(sorted(s["id"] for s in streams)) or "none"
        raise ConfigError(f"no stream {args.id!r} on the orchestrator (streams: {known})")
    text = "\n".join(f"{k}: {'-' if v is None else v}" for k, v in found.items())
    return emit(args, found, text)


def _move(args: argparse.Namespace) -> int:
    out = call(args, "POST", f"/v1/streams/{args.id}/move", {"worker": args.worker})
    return emit(args, out, f"{out['stream']} -> {out['worker']} ({out['note']})")
