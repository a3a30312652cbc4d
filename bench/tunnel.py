"""Frames/s through the tunnel vs raw ``websockets`` loopback, with a no-op detector.

**tunnel**: the real worker (``gpu_worker.server.Worker``: tunnel server,
protocol, JPEG decode, lanes, batcher, per-stream sessions, result encoding)
in a child process, with a detector that returns empty detections, and a
client speaking the real ingest-side protocol (``IngestProtocol``: OPEN,
FRAME headers, credits, RESULT parsing) on one tunnel.

**raw**: a bare ``websockets`` server in a child process that answers every
message with one message, and a client sending pre-built messages: the same
sizes (a 416x416 JPEG of the sample still plus a FRAME header; a RESULT of no
detections back) and the same request/response pattern (``--streams`` x
``--inflight`` messages in flight on one connection, the next sent when an
answer comes back).

**protocol**: the tunnel itself with nothing behind it: the real
``WorkerProtocol`` (negotiation, HELLO, OPEN, FRAME header validation, credits,
RESULT encoding) pumped over ``websockets`` in a child process, answering every
FRAME at once with an empty RESULT, and the same ``IngestProtocol`` client. Both
write as the ingest and the worker do: through the connection's
:class:`framerelay.outbox.Outbox` (everything waiting in one write; raw
websockets makes one write per message). This
is the tunnel's own cost (the issue's "frames/s through the tunnel with a no-op
detector" against raw websockets); **tunnel** adds what every real worker does
per frame besides detecting (JPEG decode, lanes, batcher, sessions), which on
2 shared cores is bound by the JPEG decode (printed beside it).

Each round runs raw and protocol back to back (in alternating order) and tunnel;
the ratio is the median of the rounds' protocol/raw (a shared machine's load
drifts: neighbours compare fairly). Prints frames/s of each and that ratio
(target >= 0.8) and tunnel/raw, and the
CPU microseconds per frame of each side (client / server, from ``/proc``); writes
``bench/results/tunnel.json`` and ``tunnel.png`` (frames/s of each round). On a
2-core machine both ends share the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import secrets
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import simplejpeg  # noqa: E402

from bench._progress import Progress  # noqa: E402
from bench._results import write_results  # noqa: E402
from framerelay import wire  # noqa: E402
from framerelay.auth import KeySet, TokenIssuer  # noqa: E402
from framerelay.credits import CreditWindow  # noqa: E402
from framerelay.detections import Detections  # noqa: E402
from framerelay.letterbox import letterbox_jpeg, read_jpeg_rgb  # noqa: E402
from framerelay.protocol import FrameFailed, IngestProtocol, ResultReceived  # noqa: E402
from framerelay.protocol import negotiation as versions  # noqa: E402
from framerelay.settings import SAMPLES  # noqa: E402

SIDE = 416
STILL = SAMPLES / "mot15" / "TUD-Stadtmitte" / "frame-000001.jpg"
MODEL = SAMPLES / "models" / "yolox_nano_416.onnx"
WORKER_ID = "bench-tunnel"
SecondsFn = Callable[[], float]


class NoopDetector:
    """A detector that finds nothing, at once: the tunnel's cost alone shows."""

    input_size: tuple[int, int] = (SIDE, SIDE)
    class_names: tuple[str, ...] = ("person",)
    providers: tuple[str, ...] = ("noop",)

    def infer(self, batch: Sequence[Any]) -> list[Detections]:
        return [Detections.empty() for _ in batch]


@dataclass(frozen=True, slots=True)
class Load:
    streams: int
    inflight: int
    warmup_s: float
    seconds: float
    tracker: str


def model_input(image: str) -> bytes:
    """The JPEG every FRAME carries: the sample still letterboxed, or a flat grey image
    (a few KB: the same decoded size, fewer bytes to move)."""
    if image == "flat":
        grey = np.full((SIDE, SIDE, 3), 114, np.uint8)
        data: bytes = simplejpeg.encode_jpeg(grey, quality=80, colorsubsampling="420")
        return data
    return letterbox_jpeg(read_jpeg_rgb(STILL), SIDE, SIDE).data


def decode_fps(jpeg: bytes, seconds: float = 1.0) -> float:
    """JPEG decodes per second on one thread: the tunnel decodes every frame, raw none."""
    from gpu_worker.images import decode_jpeg_bgr

    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        decode_jpeg_bgr(jpeg, SIDE, SIDE)
        n += 1
    return n / seconds


def frame(stream: int, seq: int) -> wire.Frame:
    return wire.Frame(
        stream_id=f"s{stream}", epoch=0, seq=seq, pts=seq * 3600, time_base=(1, 90_000),
        captured_at=time.time(), src_w=640, src_h=480, scale=0.65,
    )  # fmt: skip


# -- servers (child processes) -----------------------------------------------------------


def _worker_main(secret: str, args: dict[str, Any], port_out: Any) -> None:
    from gpu_worker.detectors import OnnxDetectorSettings
    from gpu_worker.server import Worker
    from gpu_worker.settings import WorkerSettings

    settings = WorkerSettings(
        host="127.0.0.1", port=0, worker_id=WORKER_ID, token_secrets=secret,
        detector=OnnxDetectorSettings(model=MODEL), warmup_runs=1, **args,
    )  # fmt: skip
    worker = Worker(settings, detector=NoopDetector())

    async def serve() -> None:
        _, port = await worker.start()
        port_out.put(port)
        await worker.serve_forever(asyncio.Event())

    asyncio.run(serve())


def _raw_main(reply_size: int, port_out: Any) -> None:
    from websockets.asyncio.server import ServerConnection, serve
    from websockets.exceptions import ConnectionClosed

    async def handler(ws: ServerConnection) -> None:
        pad = b"r" * (reply_size - 4)
        with contextlib.suppress(ConnectionClosed):
            async for data in ws:
                head = data[:4] if isinstance(data, bytes) else b"\0\0\0\0"
                await ws.send(head + pad)  # the stream and seq, in a RESULT's size

    async def main() -> None:
        async with serve(handler, "127.0.0.1", 0, compression=None, max_size=None) as server:
            port_out.put(next(iter(server.sockets)).getsockname()[1])
            await asyncio.Event().wait()

    asyncio.run(main())


def _protocol_main(port_out: Any) -> None:
    from websockets.asyncio.server import ServerConnection, serve
    from websockets.exceptions import ConnectionClosed

    from framerelay.outbox import CoalescingServerConnection, Outbox
    from framerelay.protocol import FrameReceived, Refused, WorkerProtocol

    hello = wire.Hello(worker_id=WORKER_ID, input_w=SIDE, input_h=SIDE,
                       class_names=["person"], providers=["noop"], max_inflight=64,
                       features=list(versions.FEATURES))  # fmt: skip

    async def handler(ws: ServerConnection) -> None:
        # as the worker's TunnelConnection: answers go through the connection's Outbox
        proto = WorkerProtocol(versions.accepted(ws.subprotocol), max_streams=64,
                               max_inflight=64)  # fmt: skip
        out = Outbox(ws, 64 * 64 + 64)
        writer = asyncio.create_task(out.run(10.0))
        with contextlib.suppress(ConnectionClosed):
            await ws.send(proto.send_hello(hello))
            async for data in ws:
                for event in proto.receive_data(data):
                    if isinstance(event, FrameReceived):
                        result = wire.Result.of(event.frame, n=0)
                        out.put(proto.send_result(result, b""))
                    elif isinstance(event, Refused):
                        out.put(event.reply)
        writer.cancel()

    async def main() -> None:
        async with serve(handler, "127.0.0.1", 0, compression=None, max_size=None,
                         subprotocols=versions.offer(),
                         create_connection=CoalescingServerConnection) as server:  # fmt: skip
            port_out.put(next(iter(server.sockets)).getsockname()[1])
            await asyncio.Event().wait()

    asyncio.run(main())


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(run: Callable[[], Meter], server: BaseProcess) -> tuple[Meter, float, float]:
    """``run()``'s meter, and the CPU microseconds per answer of this client and the
    server (every answer of the run, warm-up included)."""
    me, pid = os.getpid(), server.pid or 0
    client0, server0 = cpu_s(me), cpu_s(pid)
    meter = run()
    n = max(1, meter.total)
    return meter, (cpu_s(me) - client0) * 1e6 / n, (cpu_s(pid) - server0) * 1e6 / n


def start(target: Callable[..., None], *args: object) -> tuple[BaseProcess, int]:
    ctx = multiprocessing.get_context("spawn")
    port_out = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, port_out), daemon=True)
    proc.start()
    return proc, int(port_out.get(timeout=120))


# -- clients ----------------------------------------------------------------------------


class Meter:
    """Answers counted after the warm-up, until the end."""

    def __init__(self, load: Load) -> None:
        now = time.monotonic()
        self.start, self.end = now + load.warmup_s, now + load.warmup_s + load.seconds
        self.answers = self.errors = self.total = 0

    def count(self, error: bool = False) -> bool:
        """Count one answer; False once the measurement is over."""
        now = time.monotonic()
        self.total += 1
        if self.start <= now < self.end:
            self.answers += 1
            self.errors += error
        return now < self.end

    @property
    def fps(self) -> float:
        return self.answers / (self.end - self.start)


async def run_tunnel(url: str, token: str, jpeg: bytes, load: Load) -> Meter:
    """The ingest's side, as its TunnelClient: frames go through the connection's Outbox."""
    from websockets.asyncio.client import connect

    from framerelay.outbox import CoalescingClientConnection, Outbox

    async with connect(url, additional_headers={"Authorization": f"Bearer {token}"},
                       compression=None, max_size=None, subprotocols=versions.offer(),
                       proxy=None, create_connection=CoalescingClientConnection) as ws:  # fmt: skip
        proto = IngestProtocol(versions.accepted(ws.subprotocol))
        proto.receive_data(await ws.recv(decode=False), time.monotonic())
        out = Outbox(ws, 4096)
        writer = asyncio.create_task(out.run(10.0))
        seqs = [0] * load.streams
        for s in range(load.streams):
            window = CreditWindow(cap=load.inflight, limit=load.inflight)
            out.put(proto.open_stream(f"s{s}", window, load.tracker))
            for _ in range(load.inflight):
                out.put(proto.send_frame(frame(s, seqs[s]), jpeg, time.monotonic()))
                seqs[s] += 1
        meter = Meter(load)
        async for data in ws:
            for event in proto.receive_data(data, time.monotonic()):
                if not isinstance(event, ResultReceived | FrameFailed):
                    continue
                if not meter.count(isinstance(event, FrameFailed)):
                    writer.cancel()
                    return meter
                s = int(event.stream_id[1:])
                out.put(proto.send_frame(frame(s, seqs[s]), jpeg, time.monotonic()))
                seqs[s] += 1
        writer.cancel()
    return meter


async def run_raw(url: str, message_size: int, load: Load) -> Meter:
    from websockets.asyncio.client import connect

    body = b"f" * (message_size - 4)
    async with connect(url, compression=None, max_size=None, proxy=None) as ws:
        for s in range(load.streams):
            for i in range(load.inflight):
                await ws.send(s.to_bytes(2, "big") + i.to_bytes(2, "big") + body)
        meter = Meter(load)
        async for data in ws:
            if not meter.count():
                return meter
            head = data[:4] if isinstance(data, bytes) else b"\0\0\0\0"
            await ws.send(head + body)
    return meter


# -- main -------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--streams", type=int, default=4, help="streams on the tunnel (1-64)")
    ap.add_argument("--inflight", type=int, default=4, help="frames in flight per stream (1-64)")
    ap.add_argument("--seconds", type=float, default=6.0, help="measured per round (1-60)")
    ap.add_argument("--warmup", type=float, default=1.5, help="seconds not counted per round")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of each mode, alternating")
    ap.add_argument("--decode-threads", type=int, default=2, help="the worker's decode_threads")
    ap.add_argument("--max-batch", type=int, default=8, help="the worker's max_batch")
    ap.add_argument("--jpeg-decoder", choices=["cpu", "cpu-batch"], default="cpu",
                    help="the worker's jpeg_decoder: per frame, or by batch")  # fmt: skip
    ap.add_argument("--tracker", default="none", help="tracker of the streams (none, default)")
    ap.add_argument("--image", choices=["still", "flat"], default="still",
                    help="the JPEG: the sample still (~37 KB) or flat grey (~3 KB)")  # fmt: skip
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    load = Load(max(1, min(args.streams, 64)), max(1, min(args.inflight, 64)),
                max(0.0, args.warmup), max(1.0, min(args.seconds, 60.0)), args.tracker)  # fmt: skip
    jpeg = model_input(args.image)
    sizes = frame_sizes(jpeg)
    decode = decode_fps(jpeg)
    fps, cpu, errors = measure(args, load, jpeg, sizes)
    report(load, sizes, fps, cpu, errors, decode)
    return 0


def measure(
    args: argparse.Namespace, load: Load, jpeg: bytes, sizes: dict[str, int]
) -> tuple[dict[str, list[float]], dict[str, list[float]], int]:
    """The servers up; ``--rounds`` rounds of raw, protocol, tunnel; frames/s of each
    round, and CPU microseconds per frame of each side."""
    secret = secrets.token_urlsafe(32)
    token = TokenIssuer(KeySet.from_secrets([secret])).mint(
        "bench", [f"worker:{WORKER_ID}"], 3600, aud="worker"
    )
    settings: dict[str, Any] = {
        "max_inflight": load.inflight,
        "decode_threads": args.decode_threads,
        "jpeg_decoder": args.jpeg_decoder,
        "max_batch": args.max_batch,
        "queue_capacity": load.streams * load.inflight,
        "max_refused_frames_per_s": 0,
    }
    worker, wport = start(_worker_main, secret, settings)
    raw, rport = start(_raw_main, sizes["reply"])
    proto, pport = start(_protocol_main)
    fps: dict[str, list[float]] = {"raw": [], "protocol": [], "tunnel": []}
    cpu: dict[str, list[float]] = {f"{k}_{side}": [] for k in fps for side in ("client", "server")}
    errors = 0
    rounds = max(1, args.rounds)
    local = "ws://127.0.0.1"
    runs: list[tuple[str, BaseProcess, Callable[[], Meter]]] = [
        ("raw", raw, lambda: asyncio.run(run_raw(f"{local}:{rport}/", sizes["frame"], load))),
        ("protocol", proto,
         lambda: asyncio.run(run_tunnel(f"{local}:{pport}/", token, jpeg, load))),
        ("tunnel", worker,
         lambda: asyncio.run(run_tunnel(f"{local}:{wport}/v1/tunnel", token, jpeg, load))),
    ]  # fmt: skip
    try:
        with Progress(3 * rounds, "tunnel", "runs") as bar:
            for i in range(rounds):
                # raw and protocol back to back, in alternating order: the load of a
                # shared machine drifts, and each round's ratio compares neighbours
                order = runs if i % 2 == 0 else [runs[1], runs[0], runs[2]]
                for name, server, run in order:
                    m, client_us, server_us = timed(run, server)
                    fps[name].append(m.fps)
                    cpu[f"{name}_client"].append(client_us)
                    cpu[f"{name}_server"].append(server_us)
                    errors += m.errors if name != "raw" else 0
                    bar.advance()
    finally:
        for proc in (worker, raw, proto):
            proc.kill()
            proc.join(5)
    return fps, cpu, errors


def frame_sizes(jpeg: bytes) -> dict[str, int]:
    """Bytes of a FRAME (header + JPEG) and of its RESULT (no detections), as sent."""
    f = frame(0, 1_000_000)
    result = wire.Result.of(f, n=0, timings={
        k: 1.234 for k in ("decode_ms", "queue_ms", "infer_ms", "track_ms", "batch", "worker_ms")
    })  # fmt: skip
    return {"frame": len(wire.encode(f, jpeg)), "reply": len(wire.encode(result))}


def report(
    load: Load,
    sizes: dict[str, int],
    fps: dict[str, list[float]],
    cpu: dict[str, list[float]],
    errors: int,
    decode: float,
) -> None:
    raw, tunnel = statistics.median(fps["raw"]), statistics.median(fps["tunnel"])
    protocol = statistics.median(fps["protocol"])
    paired = [p / r for p, r in zip(fps["protocol"], fps["raw"], strict=True) if r]
    ratio = statistics.median(paired) if paired else 0.0
    worker_ratio = tunnel / raw if raw else 0.0
    print(f"{load.streams} streams x {load.inflight} in flight on one connection; "
          f"{sizes['frame']} B out, {sizes['reply']} B back; {len(fps['raw'])} rounds of "
          f"{load.seconds:.0f} s (median):")  # fmt: skip
    print(f"  raw websockets  {raw:9.0f} frames/s   {[round(v) for v in fps['raw']]}")
    print(f"  tunnel protocol {protocol:9.0f} frames/s   {[round(v) for v in fps['protocol']]}")
    print(f"  worker (no-op)  {tunnel:9.0f} frames/s   {[round(v) for v in fps['tunnel']]}")
    print(f"  ratio protocol/raw {ratio:.2f} (target >= 0.8): "
          f"{'ok' if ratio >= 0.8 else 'BELOW'}; worker/raw {worker_ratio:.2f}")  # fmt: skip
    print(f"    (median of each round's ratio {[round(v, 2) for v in paired]}; "
          f"ratio of the medians {protocol / raw if raw else 0.0:.2f})")  # fmt: skip
    print(f"  JPEG decode alone, one thread: {decode:.0f} frames/s (the worker decodes every "
          f"frame; raw websockets does not)")  # fmt: skip
    med = {k: statistics.median(v) for k, v in cpu.items()}
    print("  CPU per frame, us (client / server), median of rounds:")
    for name in ("raw", "protocol", "tunnel"):
        print(f"    {name:9s} {med[name + '_client']:6.1f} / {med[name + '_server']:6.1f}")
    if errors:
        print(f"  {errors} frames answered with an ERROR (counted in the tunnel's figure)")
    write_results("tunnel", {
        "streams": load.streams, "inflight": load.inflight, "seconds": load.seconds,
        "frame_bytes": sizes["frame"], "reply_bytes": sizes["reply"], "tracker": load.tracker,
        "raw_fps": fps["raw"], "protocol_fps": fps["protocol"], "tunnel_fps": fps["tunnel"],
        "ratio": ratio, "round_ratios": paired, "worker_ratio": worker_ratio, "errors": errors,
        "decode_fps_one_thread": decode, "cpu_us_per_frame": cpu,
    }, plot)  # fmt: skip


def plot(fig: Figure, results: dict[str, Any]) -> None:
    """Frames/s of each round, raw websockets beside the tunnel, and the median ratio."""
    ax = fig.subplots()
    x = range(len(results["raw_fps"]))
    ax.bar([i - 0.27 for i in x], results["raw_fps"], 0.27, label="raw websockets")
    ax.bar(list(x), results["protocol_fps"], 0.27, label="tunnel protocol")
    ax.bar([i + 0.27 for i in x], results["tunnel_fps"], 0.27, label="worker (no-op detector)")
    ax.axhline(results["decode_fps_one_thread"], color="tab:gray", ls=":",
               label="JPEG decode alone, one thread")  # fmt: skip
    ax.set_xticks(list(x), [f"round {i + 1}" for i in x])
    load = f"{results['streams']} streams x {results['inflight']} in flight, one connection"
    ax.set(
        ylabel="frames / s",
        title=f"{load}: protocol / raw {results['ratio']:.2f} (target >= 0.8)",
    )
    top = max([*results["raw_fps"], *results["protocol_fps"], *results["tunnel_fps"],
               results["decode_fps_one_thread"]])  # fmt: skip
    ax.set_ylim(0, 1.2 * top)
    ax.legend(loc="upper center", ncols=3, fontsize="small")


if __name__ == "__main__":
    raise SystemExit(main())
