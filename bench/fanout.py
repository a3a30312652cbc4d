"""Results fan-out: the WebSocket hub to 1/10/100 subscribers, and Redis, vs raw redis-py.

    python bench/fanout.py [--seconds 5] [--results results.jsonl] [--redis-url URL]

Real results of the sample clip (from ``framerelay demo --out``, made here when
``--results`` is not given) are published as fast as they are taken and at a
camera-like 25/s:

* **hub**: a hub process (the real ``ResultHub`` behind uvicorn, auth on) and
  N WebSocket subscribers in this process. Throughput = results/s each
  subscriber receives when the publisher goes flat out (the hub drops the
  oldest for subscribers that fall behind: drops are reported); added delay =
  subscriber receive time - publish time at 25 results/s.
* **redis**: the real ``RedisPublisher`` (PUBLISH + XADD per result,
  pipelined) against a private redis-server (or ``--redis-url``, under a
  prefix of its own, deleted afterwards); added delay = a pub/sub
  subscriber's receive time - offer time.
* **ceiling**: raw redis-py pipelined PUBLISH (and PUBLISH+XADD) of the same
  JSON on the same server, batches of the publisher's size.

Prints ratios to the ceiling and writes ``bench/results/fanout.json`` and
``fanout.png``. Not run by the tests. The subscribers share this process, so at 100 they measure
this machine's client side as much as the hub.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from websockets.asyncio.client import connect

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._progress import Progress  # noqa: E402
from bench._redis import add_redis_url, delete_prefix, redis_for_bench  # noqa: E402
from bench._results import write_results  # noqa: E402
from framerelay.auth import KeySet, TokenIssuer  # noqa: E402
from framerelay.results import ResultRecord  # noqa: E402
from ingest.bus import ResultBus  # noqa: E402
from ingest.redis_bus import RedisKeys, RedisPublisher  # noqa: E402
from ingest.redis_bus import connect as redis_connect  # noqa: E402

STREAM = "cam-1"


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


# --- the hub process ---------------------------------------------------------------


async def serve_hub(records_path: Path, queue_size: int) -> None:
    """The hub process: serve, and publish on command (one JSON line per run on stdin)."""
    from fastapi import FastAPI
    from prometheus_client import CollectorRegistry

    from framerelay.listeners import ListenerSettings
    from ingest.hub import build_hub, results_router
    from ingest.server import api_server
    from ingest.settings import IngestSettings, ResultsSettings

    lines = records_path.read_text().splitlines()  # noqa: ASYNC240 - once, at start
    records = [ResultRecord.model_validate_json(x).model_copy(update={"stream_id": STREAM})
               for x in lines]  # fmt: skip
    limits = ResultsSettings(queue_size=queue_size, ping_interval_s=0)
    secret = os.environ["FRAMERELAY_TOKEN_SECRETS"]
    # every subscriber comes from this one host: no per-address cap (framerelay.listeners)
    listener = ListenerSettings(max_connections_per_peer=0)
    settings = IngestSettings(token_secrets=secret, api_port=0, results=limits, listener=listener)
    bus = ResultBus()
    app = FastAPI()
    app.include_router(results_router(build_hub(bus, settings, CollectorRegistry())))
    server, sock = api_server(app, settings)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no event for it
        await asyncio.sleep(0.01)
    print(json.dumps({"port": sock.getsockname()[1]}), flush=True)
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        cmd = json.loads(line)  # {"rate": r, "seconds": s}
        sent = await publish(bus, records, cmd["rate"], cmd["seconds"])
        print(json.dumps({"published": sent, "dropped": bus.dropped}), flush=True)
    server.should_exit = True
    await task


async def publish(bus: ResultBus, records: list[ResultRecord], rate: float, seconds: float) -> int:
    """At ``rate``/s (0: as fast as the loop allows, yielding every 16 results)."""
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        now = time.time()
        bus.publish(records[n % len(records)].model_copy(update={"received_at": now}))
        n += 1
        if rate > 0:
            await asyncio.sleep(max(0.0, t0 + n / rate - time.monotonic()))
        elif n % 16 == 0:
            await asyncio.sleep(0)
    return n


# --- subscribers --------------------------------------------------------------------


async def subscriber(url: str, token: str, out: dict[str, Any], ready: asyncio.Event) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with connect(url, additional_headers=headers, compression=None, proxy=None,
                       max_queue=1024) as ws:  # fmt: skip
        await ws.recv()  # subscribed
        ready.set()
        async for raw in ws:
            now = time.time()
            text = str(raw)
            i = text.find('"received_at":')
            if i >= 0 and out["measuring"]:
                sent = float(text[i + 14 : text.index(",", i)])
                out["delays"].append((now - sent) * 1000)
                out["count"] += 1


async def hub_run(hub: subprocess.Popen[str], port: int, token: str, n: int, rate: float,
                  seconds: float) -> dict[str, Any]:  # fmt: skip
    url = f"ws://127.0.0.1:{port}/v1/results?stream={STREAM}"
    stats: list[dict[str, Any]] = [{"delays": [], "count": 0, "measuring": False} for _ in range(n)]
    events = [asyncio.Event() for _ in range(n)]
    pairs = zip(stats, events, strict=True)
    tasks = [asyncio.create_task(subscriber(url, token, s, e)) for s, e in pairs]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 30)
    for s in stats:
        s["measuring"] = True
    assert hub.stdin is not None and hub.stdout is not None
    hub.stdin.write(json.dumps({"rate": rate, "seconds": seconds}) + "\n")
    hub.stdin.flush()
    done = json.loads(await asyncio.to_thread(hub.stdout.readline))
    published = done["published"] / seconds
    await asyncio.sleep(0.5)  # the tail in flight
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    delays = [d for s in stats for d in s["delays"]]
    per_sub = sum(s["count"] for s in stats) / n / seconds
    return {"subscribers": n, "rate": rate, "results_per_s_per_subscriber": per_sub,
            "messages_per_s": per_sub * n, "p50_ms": pct(delays, 50), "p99_ms": pct(delays, 99),
            "published_per_s": published, "hub_dropped_total": done["dropped"]}  # fmt: skip


def bench_hub(
    records: Path, seconds: float, counts: list[int], bar: Progress
) -> list[dict[str, Any]]:
    secret = secrets.token_urlsafe(32)
    env = {**os.environ, "FRAMERELAY_TOKEN_SECRETS": secret}
    hub = subprocess.Popen([sys.executable, __file__, "--serve-hub", str(records)], env=env,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert hub.stdout is not None
    port = json.loads(hub.stdout.readline())["port"]
    issuer = TokenIssuer(KeySet.from_secrets([secret]))
    token = issuer.mint("bench", [f"results:{STREAM}"], 3600, aud="ingest")
    rows = []
    try:
        for n in counts:
            for rate in (25.0, 0.0):
                row = asyncio.run(hub_run(hub, port, token, n, rate, seconds))
                rows.append(row)
                print(f"hub  {n:3d} subs  {'max' if not rate else f'{rate:.0f}/s':>5}  "
                      f"{row['results_per_s_per_subscriber']:8.0f} results/s/sub  "
                      f"{row['messages_per_s']:8.0f} msg/s  p50 {row['p50_ms']:6.2f} ms  "
                      f"p99 {row['p99_ms']:6.2f} ms", flush=True)  # fmt: skip
                bar.advance()
    finally:
        if hub.stdin:
            hub.stdin.close()  # the hub process ends at the end of its input
        try:
            hub.wait(20)
        except subprocess.TimeoutExpired:
            hub.send_signal(signal.SIGKILL)
            hub.wait(5)
        if hub.stdout:
            hub.stdout.close()
    return rows


# --- Redis --------------------------------------------------------------------------


async def redis_publisher(
    url: str, prefix: str, records: list[ResultRecord], n: int
) -> dict[str, Any]:
    bus, client = ResultBus(), redis_connect(url)
    pub = RedisPublisher(client, RedisKeys(f"{prefix}:pub"), bus.ids, buffer=n + 1)
    bus.observe(pub.offer)
    stop = asyncio.Event()
    task = asyncio.create_task(pub.run(stop))
    t0 = time.perf_counter()
    for i in range(n):
        bus.publish(records[i % len(records)])
        if i % 256 == 0:
            await asyncio.sleep(0)
    while pub.counts["stored"] < n:  # noqa: ASYNC110 - polling a counter
        await asyncio.sleep(0.001)
    took = time.perf_counter() - t0
    stop.set()
    await task
    await client.aclose()
    return {"results": n, "results_per_s": n / took}


async def redis_delay(
    url: str, prefix: str, records: list[ResultRecord], rate: float, seconds: float
) -> dict[str, Any]:
    bus, client, reader = ResultBus(), redis_connect(url), redis_connect(url)
    keys = RedisKeys(f"{prefix}:delay")
    pub = RedisPublisher(client, keys, bus.ids)
    bus.observe(pub.offer)
    ps = reader.pubsub()
    await ps.subscribe(keys.channel(STREAM))
    await ps.get_message(timeout=1)
    stop = asyncio.Event()
    task = asyncio.create_task(pub.run(stop))
    delays: list[float] = []

    async def listen() -> None:
        while True:
            msg = await ps.get_message(ignore_subscribe_messages=True, timeout=1)
            if msg is not None:
                sent = json.loads(msg["data"])["received_at"]
                delays.append((time.time() - sent) * 1000)

    listener = asyncio.create_task(listen())
    await publish(bus, [r.model_copy(update={"stream_id": STREAM}) for r in records], rate, seconds)
    await asyncio.sleep(0.5)
    listener.cancel()
    stop.set()
    await asyncio.gather(task, listener, return_exceptions=True)
    await ps.aclose()  # type: ignore[no-untyped-call]
    await client.aclose()
    await reader.aclose()
    return {"rate": rate, "p50_ms": pct(delays, 50), "p99_ms": pct(delays, 99), "n": len(delays)}


async def raw_ceiling(url: str, prefix: str, payload: str, n: int, batch: int, xadd: bool) -> float:
    client = redis_connect(url)
    t0 = time.perf_counter()
    for start in range(0, n, batch):
        pipe = client.pipeline(transaction=False)
        for _ in range(min(batch, n - start)):
            pipe.publish(f"{prefix}:raw:live", payload)
            if xadd:
                pipe.xadd(f"{prefix}:raw:results", {"r": payload}, maxlen=100_000, approximate=True)
        await pipe.execute()
    took = time.perf_counter() - t0
    await client.aclose()
    return n / took


def bench_redis(
    url: str, records: list[ResultRecord], n: int, seconds: float, bar: Progress
) -> dict[str, Any]:
    """The Redis rows on ``url``, every key under a prefix of this run's, deleted after."""
    prefix = f"bench-fanout-{secrets.token_hex(4)}"
    payload = records[0].model_dump_json()
    runs: dict[str, Callable[[], Coroutine[Any, Any, Any]]] = {
        "raw_pub": lambda: raw_ceiling(url, prefix, payload, n, 256, xadd=False),
        "raw_both": lambda: raw_ceiling(url, prefix, payload, n, 256, xadd=True),
        "ours": lambda: redis_publisher(url, prefix, records, n),
        "live": lambda: redis_delay(url, prefix, records, 25.0, seconds),
        "flat": lambda: redis_delay(url, prefix, records, 0.0, seconds),
    }
    got: dict[str, Any] = {}
    try:
        for name, run in runs.items():
            got[name] = asyncio.run(run())
            bar.advance()
    finally:
        asyncio.run(_cleanup(url, prefix))
    ours = got["ours"]["results_per_s"]
    return {"raw_publish_per_s": got["raw_pub"], "raw_publish_xadd_per_s": got["raw_both"],
            "publisher_results_per_s": ours, "ratio_to_raw_publish": ours / got["raw_pub"],
            "ratio_to_raw_publish_xadd": ours / got["raw_both"],
            "delay_at_25_per_s": got["live"], "delay_flat_out": got["flat"],
            "payload_bytes": len(payload)}  # fmt: skip


async def _cleanup(url: str, prefix: str) -> None:
    client = redis_connect(url)
    try:
        await delete_prefix(client, prefix)
    finally:
        await client.aclose()


def make_results() -> Path:
    out = Path(tempfile.mkdtemp(prefix="fanout-")) / "results.jsonl"
    subprocess.run([sys.executable, "-m", "framerelay", "demo", "--quiet", "--out", str(out)],
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL)  # fmt: skip
    return out


def subscriber_counts(text: str) -> list[int]:
    """An argparse type: comma-separated subscriber counts, 1-1000 each."""
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None
    if not counts or not all(1 <= n <= 1000 for n in counts):
        raise argparse.ArgumentTypeError(f"each count must be 1-1000: {text!r}")
    return counts


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="per measured run")
    parser.add_argument("--results", type=Path, help="JSONL results (default: run the demo)")
    parser.add_argument("--subscribers", type=subscriber_counts, default=[1, 10, 100],
                        metavar="N,N", help="hub subscriber counts (default 1,10,100)")  # fmt: skip
    parser.add_argument("--redis-results", type=int, default=50_000,
                        help="results per Redis throughput run")  # fmt: skip
    add_redis_url(parser)
    parser.add_argument("--serve-hub", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--queue-size", type=int, default=256, help="the hub's per-subscriber queue"
    )
    args = parser.parse_args()
    if args.results is not None and not args.results.is_file():
        parser.error(f"--results: no such file: {args.results}")
    return args


def main() -> int:
    args = parse_args()
    if args.serve_hub:
        asyncio.run(serve_hub(args.serve_hub, args.queue_size))
        return 0
    counts: list[int] = args.subscribers
    with redis_for_bench(args.redis_url, "fanout") as url:
        if args.results is None:
            print("making results: framerelay demo on the sample clip ...", flush=True)
        path = args.results or make_results()
        records = [ResultRecord.model_validate_json(x) for x in path.read_text().splitlines()]
        records = [r.model_copy(update={"stream_id": STREAM}) for r in records]
        with Progress(2 * len(counts) + 5, "fanout", "runs") as bar:
            hub = bench_hub(path, args.seconds, counts, bar)
            red = bench_redis(url, records, args.redis_results, args.seconds, bar)
    report = {"machine": {"cpus": os.cpu_count()}, "seconds": args.seconds, "hub": hub,
              "redis": red}  # fmt: skip
    _print(hub, red)
    write_results("fanout", report, plot)
    return 0


def _print(hub: list[dict[str, Any]], red: dict[str, Any]) -> None:
    print(f"redis raw pipelined PUBLISH        {red['raw_publish_per_s']:9.0f} msg/s (ceiling)")
    print(f"redis raw pipelined PUBLISH+XADD   {red['raw_publish_xadd_per_s']:9.0f} msg/s")
    print(f"RedisPublisher (PUBLISH+XADD)      {red['publisher_results_per_s']:9.0f} results/s"
          f"  = {red['ratio_to_raw_publish']:.2f}x raw PUBLISH, "
          f"{red['ratio_to_raw_publish_xadd']:.2f}x raw PUBLISH+XADD")  # fmt: skip
    for k in ("delay_at_25_per_s", "delay_flat_out"):
        d = red[k]
        print(f"redis live delay ({k[6:]}): p50 {d['p50_ms']:.2f} ms  p99 {d['p99_ms']:.2f} ms")
    for row in hub:
        if row["rate"] == 0:
            print(f"hub {row['subscribers']:3d} subs flat out: "
                  f"{row['messages_per_s'] / red['raw_publish_per_s']:.2f}x raw PUBLISH "
                  f"(messages delivered/s)")  # fmt: skip


def plot(fig: Figure, report: dict[str, Any]) -> None:
    """Messages delivered per second flat out against the Redis ceiling; delay at 25/s."""
    rate, delay = fig.subplots(1, 2)
    red, hub = report["redis"], report["hub"]
    flat = [r for r in hub if r["rate"] == 0]
    live = [r for r in hub if r["rate"] != 0]
    labels = [f"hub, {r['subscribers']} subs" for r in flat] + ["RedisPublisher"]
    values = [r["messages_per_s"] for r in flat] + [red["publisher_results_per_s"]]
    rate.bar(labels, values, color="tab:blue")
    rate.axhline(red["raw_publish_per_s"], color="tab:red", ls="--", label="raw PUBLISH (ceiling)")
    rate.set_ylim(0, 1.2 * max([*values, red["raw_publish_per_s"]]))
    rate.set(ylabel="messages delivered / s", title="flat out")
    rate.tick_params(axis="x", labelrotation=20)
    rate.legend()
    names = [f"hub, {r['subscribers']} subs" for r in live] + ["Redis pub/sub"]
    rows = [*live, red["delay_at_25_per_s"]]
    x = range(len(rows))
    delay.bar([i - 0.2 for i in x], [r["p50_ms"] for r in rows], 0.4, label="p50")
    delay.bar([i + 0.2 for i in x], [r["p99_ms"] for r in rows], 0.4, label="p99")
    delay.set_xticks(list(x), names, rotation=20)
    delay.set(ylabel="added delay (ms)", title="at 25 results/s")
    delay.legend()


if __name__ == "__main__":
    raise SystemExit(main())
