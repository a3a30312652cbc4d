"""A result hub fed with real results at a fixed rate, as its own process.

``python tests/results/hub_server.py --records R.jsonl --rate 25 ...`` prints
``{"port": P}`` once it listens, then publishes the records round-robin as
stream ``--stream`` (each stamped ``received_at`` = now, so a subscriber's
``time.time() - received_at`` is the delivery delay) until SIGTERM. The token
secret comes from ``FRAMERELAY_TOKEN_SECRETS``. ``GET /metrics`` serves the
hub's Prometheus metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import time
from pathlib import Path

from fastapi import FastAPI, Response
from prometheus_client import CollectorRegistry, generate_latest

from framerelay.results import ResultRecord
from ingest.bus import ResultBus
from ingest.hub import build_hub, results_router
from ingest.server import api_server
from ingest.settings import IngestSettings, ResultsSettings


async def publish(
    bus: ResultBus, records: list[ResultRecord], stream: str, rate: float, phase: float
) -> None:
    """Publish on a wall-clock grid, ``(k + phase) / rate`` (two hubs can interleave)."""
    k = math.ceil(time.time() * rate - phase)
    i = 0
    while True:
        delay = (k + phase) / rate - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        now = time.time()
        src = records[i % len(records)]
        bus.publish(src.model_copy(update={
            "stream_id": stream, "seq": i, "received_at": now,
            "captured_at": now - src.latency_ms / 1000,
        }))  # fmt: skip
        i += 1
        k += 1


async def main(args: argparse.Namespace) -> None:
    records = [ResultRecord.model_validate_json(x) for x in args.records.read_text().splitlines()]
    settings = IngestSettings(
        token_secrets=os.environ["FRAMERELAY_TOKEN_SECRETS"],
        api_port=0,
        results=ResultsSettings(
            queue_size=args.queue_size,
            send_timeout_s=args.send_timeout,
            ping_interval_s=args.ping_interval,
            ping_timeout_s=max(args.ping_interval, 1.0),
            send_buffer_bytes=args.send_buffer,
        ),
    )
    bus = ResultBus()
    registry = CollectorRegistry()
    hub = build_hub(bus, settings, registry)
    app = FastAPI()
    app.include_router(results_router(hub))

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type="text/plain")

    server, sock = api_server(app, settings)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no event for it
        await asyncio.sleep(0.01)
    print(json.dumps({"port": sock.getsockname()[1]}), flush=True)
    publisher = asyncio.create_task(publish(bus, records, args.stream, args.rate, args.phase))
    await stop.wait()
    publisher.cancel()
    server.should_exit = True
    await asyncio.gather(serving, publisher, return_exceptions=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=Path, required=True)
    parser.add_argument("--rate", type=float, default=25.0)
    parser.add_argument("--stream", default="cam-1")
    parser.add_argument("--phase", type=float, default=0.0, help="offset in periods (0..1)")
    parser.add_argument("--queue-size", type=int, default=256)
    parser.add_argument("--send-timeout", type=float, default=2.0)
    parser.add_argument("--ping-interval", type=float, default=0.0)
    parser.add_argument("--send-buffer", type=int, default=32768)
    asyncio.run(main(parser.parse_args()))
