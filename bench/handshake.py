"""What TLS and token verification add to one tunnel handshake.

    python bench/handshake.py [--count 200]

Two real ``framerelay worker`` processes on loopback: one plain (``ws://``,
HS256 shared secret), one as across clouds (``wss://`` with a certificate
from the orchestrator's CA, verified by the client; EdDSA tokens checked
against the public key set). Each handshake is what an ingest does at every
(re)connect: mint a token, TCP connect, TLS, WebSocket upgrade with the
token, until the worker's HELLO arrives. Alternating, ``--count`` each;
prints p50/p99 of both and the difference (target: <= 5 ms p50). Writes
``bench/results/handshake.json`` (with every sample) and ``handshake.png``
(the distribution of both).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._progress import Progress  # noqa: E402
from bench._results import write_results  # noqa: E402
from bench._trust import make_trust  # noqa: E402
from framerelay import wire  # noqa: E402
from framerelay.auth import KeySet, TokenIssuer  # noqa: E402
from framerelay.launcher import LocalWorker  # noqa: E402
from framerelay.protocol.negotiation import offer  # noqa: E402


async def handshake(url: str, token: Callable[[], str], ctx: ssl.SSLContext | None) -> float:
    from websockets.asyncio.client import connect

    t0 = time.perf_counter()
    headers = {"Authorization": f"Bearer {token()}"}
    name = "bench-worker.pods.framerelay" if ctx else None
    async with connect(url, additional_headers=headers, ssl=ctx, compression=None, proxy=None,
                       subprotocols=offer(),
                       server_hostname=name) as ws:  # fmt: skip
        header, _ = wire.decode(await ws.recv(decode=False))
        elapsed = (time.perf_counter() - t0) * 1000
    assert isinstance(header, wire.Hello)
    return elapsed


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--count", type=int, default=200, help="handshakes per mode (10-5000)")
    args = ap.parse_args()
    count = max(10, min(args.count, 5000))
    secret = secrets.token_urlsafe(32)
    hs = TokenIssuer(KeySet.from_secrets([secret]))
    with tempfile.TemporaryDirectory() as tmp:
        trust = make_trust(Path(tmp))
        ed = TokenIssuer(trust.keys)
        ctx = ssl.create_default_context(cafile=str(trust.ca))
        plain = LocalWorker(secret, worker_id="bench-worker", args=["--threads", "1"])
        tls = LocalWorker(worker_id="bench-worker", args=["--threads", "1"], env=trust.worker_env())
        with plain, tls, Progress(count + 10, "handshake", "rounds") as bar:
            modes = {
                "ws+HS256": (plain.url, lambda: hs.mint("ingest", ["worker:bench-worker"], 3600,
                                                        aud="worker"), None),
                "wss+EdDSA": (tls.url, lambda: ed.mint("ingest", ["worker:bench-worker"], 3600,
                                                       aud="worker"), ctx),
            }  # fmt: skip
            times: dict[str, list[float]] = {m: [] for m in modes}
            for i in range(count + 10):
                for name, (url, tok, c) in modes.items():
                    ms = asyncio.run(handshake(url, tok, c))
                    if i >= 10:  # the first ones warm both sides up
                        times[name].append(ms)
                bar.advance()
    report = {m: {"p50_ms": statistics.median(v), "p99_ms": pct(v, 0.99)} for m, v in times.items()}
    added = report["wss+EdDSA"]["p50_ms"] - report["ws+HS256"]["p50_ms"]
    print(f"{count} handshakes each (token mint, TCP, TLS, upgrade, HELLO), alternating:")
    for name, r in report.items():
        print(f"  {name:10s} p50 {r['p50_ms']:6.2f} ms   p99 {r['p99_ms']:6.2f} ms")
    print(f"  TLS + EdDSA add {added:+.2f} ms p50 (target <= 5 ms): "
          f"{'ok' if added <= 5 else 'OVER'}")  # fmt: skip
    write_results("handshake", {"count": count, "modes": report, "added_p50_ms": added,
                                "samples_ms": times}, plot)  # fmt: skip
    return 0


def plot(fig: Figure, results: dict[str, Any]) -> None:
    """The distribution (CDF) of each mode's handshake times, medians marked."""
    from matplotlib.ticker import FuncFormatter

    ax = fig.subplots()
    for name, samples in results["samples_ms"].items():
        ordered = sorted(samples)
        share = [(i + 1) / len(ordered) for i in range(len(ordered))]
        line = ax.plot(
            ordered, share, label=f"{name} (p50 {results['modes'][name]['p50_ms']:.2f} ms)"
        )
        ax.axvline(results["modes"][name]["p50_ms"], color=line[0].get_color(), ls=":")
    ax.set_xscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.set(xlabel="handshake (ms, log scale)", ylabel="share of handshakes",
           title=f"{results['count']} tunnel handshakes per mode, alternating")  # fmt: skip
    ax.legend(loc="lower right")


if __name__ == "__main__":
    raise SystemExit(main())
