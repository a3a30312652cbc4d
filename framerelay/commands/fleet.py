"""``framerelay fleet show``: tiers, pods, streams and cost in one table (alias ``status``)."""

from __future__ import annotations

import argparse
from typing import Any

from framerelay.commands._orch_client import add_url, call, emit, table

HELP = "fleet status: tiers, pods, placement and cost (via the orchestrator)"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("fleet", help=HELP, description=HELP)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    st = verbs.add_parser("show", aliases=["status"], help="a readable summary")
    add_url(st)
    st.set_defaults(func=_status)


def _held(tier: dict[str, Any]) -> str:
    wait = tier.get("no_capacity_retry_in_s")
    return f"no capacity: next try in {wait:.0f} s" if wait else "-"


def _why(pod: dict[str, Any]) -> str:
    """What the provider says of a pod that is not serving yet (Kubernetes: why it is
    Pending, e.g. the scheduler's message), else its last health problem."""
    if pod["ready"]:
        return "-"
    return str(pod.get("provider_reason") or pod.get("last_error") or "-")


def render(status: dict[str, Any]) -> str:
    tiers = table(
        [(t["name"], "spot" if t["spot"] else "on-demand", t["target"], t["pods"], t["ready"],
          t["draining"], _held(t)) for t in status["tiers"]],
        ("TIER", "KIND", "TARGET", "PODS", "READY", "DRAINING", "NOTE"),
    )  # fmt: skip
    pods = table(
        [
            (
                p["name"],
                p["state"],
                "yes" if p["ready"] else "no",
                f"{p['cost_per_hr']:.3f}",
                ",".join(p["streams"]) or "-",
                _why(p),
            )
            for p in status["pods"]
        ],
        ("POD", "STATE", "READY", "$/H", "STREAMS", "WHY"),
    )
    c = status["cost"]
    spent = f"spent ${c['fleet_usd']:.4f}"
    if c.get("serverless_usd"):  # older orchestrators do not say
        spent += f" (serverless ${c['serverless_usd']:.4f})"
    cost = " | ".join((
        f"burn ${c['burn_usd_per_hr']:.3f}/h",
        spent,
        f"{c['stream_hours']:.3f} stream-h at ${c['cost_per_stream_hour_usd']:.4f}/stream-h",
        f"saving vs all on-demand {100 * c['saving_vs_ondemand']:.1f} %",
    ))  # fmt: skip
    unplaced = ", ".join(status["unplaced"]) or "none"
    head = f"provider {status['provider']}  leader {status['leader']}  unplaced streams: {unplaced}"
    return "\n\n".join((head, tiers, pods, cost))


def _status(args: argparse.Namespace) -> int:
    status = call(args, "GET", "/v1/fleet")
    return emit(args, status, render(status))
