"""``framerelay pods list|create|terminate``: the orchestrator's GPU pods."""

from __future__ import annotations

import argparse

from framerelay.commands._orch_client import add_url, call, emit, table

HELP = "list, create or terminate GPU worker pods (via the orchestrator)"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("pods", help=HELP, description=HELP)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    ls = verbs.add_parser("list", help="pods with state, health, cost and streams")
    add_url(ls)
    ls.set_defaults(func=_list)
    mk = verbs.add_parser("create", help="one more warm pod in a tier")
    mk.add_argument("--tier", required=True)
    add_url(mk)
    mk.set_defaults(func=_create)
    rm = verbs.add_parser("terminate", help="terminate a pod now")
    rm.add_argument("name")
    add_url(rm)
    rm.set_defaults(func=_terminate)


def _list(args: argparse.Namespace) -> int:
    pods = call(args, "GET", "/v1/pods")
    rows = [
        (p["name"], p["tier"], "spot" if p["spot"] else "on-demand", p["state"],
         "yes" if p["ready"] else "no", p["gpu_type"], f"{p['cost_per_hr']:.3f}",
         f"{p['capacity_fps']:.0f}", len(p["streams"]), p.get("last_error") or "")
        for p in pods
    ]  # fmt: skip
    header = ("POD", "TIER", "KIND", "STATE", "READY", "GPU", "$/H", "CAP FPS", "STREAMS", "ERROR")
    return emit(args, pods, table(rows, header))


def _create(args: argparse.Namespace) -> int:
    out = call(args, "POST", "/v1/pods", {"tier": args.tier})
    return emit(args, out, f"tier {out['tier']}: floor now {out['floor']} ({out['note']})")


def _terminate(args: argparse.Namespace) -> int:
    out = call(args, "DELETE", f"/v1/pods/{args.name}")
    return emit(args, out, f"terminated {out['terminated']}")
