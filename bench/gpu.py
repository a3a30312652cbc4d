"""End to end through loopback tunnels vs a bare loop on the same engine (issue 14).

**tunnel**: the real worker (``gpu_worker.server.Worker`` with the real
``OnnxDetector``: tunnel server, JPEG decode, lanes, batcher, per-stream
trackers, results) in a spawned child process; ``--tunnels`` loopback tunnels
from this process, each carrying ``--streams`` streams, spoken by in-process
asyncio senders with the ingest-side protocol (``IngestProtocol``: OPEN, FRAME,
credits, RESULT parsing). The frames are real JPEGs made once, before the run,
the way the ingest makes them (the sample clips decoded, letterboxed to the
model input and encoded by ``ingest.prepare``; up to 250 distinct frames, each
stream cycling from its own offset). Each stream sends ``--fps`` frames/s (a
frame due with no credit left is dropped and counted, as the ingest does) or,
with ``--fps 0``, flat out (the next frame as soon as a result comes back).

**bare**: then, in the same child, the same detector object (same session,
providers, batch size) in a plain loop: the same JPEGs decoded by the worker's
decoder in its decode pool (the next batch decodes while this one infers),
``infer`` on batches of the worker's batch size, flat out. **model only**: the
same loop on already decoded images (the engine's ceiling).

Prints frames/s of each, the ratio tunnel / bare (target >= 0.8), p50/p99
latency (FRAME sent -> RESULT back), errors and drops, the model (file and
input size), the batch size, the providers really in use (from the worker's
HELLO), and the GPU with its mean utilisation during each phase (NVML through
``gpu_worker.gpu_stats``), or "no GPU: CPU provider". Writes
``bench/results/<--name>.json`` and ``.png`` (frames/s of each; the latency
distribution), or into ``--out``.

CPU (defaults, about 30 s)::

    python bench/gpu.py

One GPU (issue 14's scale: 8 tunnels x 128 cameras at 5 fps, then flat out)::

    python bench/gpu.py --providers tensorrt --tunnels 8 --streams 128 --fps 5 \\
        --max-batch 64 --decode-threads 8 --seconds 20 --warmup 10
    python bench/gpu.py --providers tensorrt --tunnels 8 --streams 128 --fps 0 \\
        --max-batch 64 --decode-threads 8 --seconds 20 --warmup 10 --name gpu-flat

``--detector-option KEY=VALUE`` and ``--worker-option KEY=VALUE`` pass any
other setting of ``OnnxDetectorSettings`` / ``WorkerSettings`` (checked before
anything starts). scripts/gpu-check.sh runs both on a bare GPU machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import re
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from websockets.asyncio.client import ClientConnection

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench._gpu_rig import (  # noqa: E402
    WORKER_ID,
    GpuSampler,
    answer,
    start_worker,
    wait_ready,
    worker_settings,
)
from bench._progress import Progress  # noqa: E402
from bench._results import RESULTS, write_results  # noqa: E402
from framerelay import wire  # noqa: E402
from framerelay.auth import KeySet, TokenIssuer  # noqa: E402
from framerelay.credits import CreditWindow  # noqa: E402
from framerelay.geometry import Letterbox  # noqa: E402
from framerelay.protocol import (  # noqa: E402
    FrameFailed,
    IngestEvent,
    IngestProtocol,
    PeerError,
    ProtocolViolation,
    ResultReceived,
)
from framerelay.protocol import negotiation as versions  # noqa: E402
from framerelay.settings import SAMPLES  # noqa: E402

CLIPS = sorted((SAMPLES / "mot15").glob("*/*.mp4"))
MODEL = SAMPLES / "models" / "yolox_nano_416.onnx"
MAX_FRAMES = 250
"""Distinct frames of the sample clips (71 + 179)."""
CPU_ONLY = "no GPU: CPU provider"
TARGET_RATIO = 0.8


# -- the frames ---------------------------------------------------------------------------


def encode_frames(limit: int, size: tuple[int, int]) -> tuple[list[bytes], Letterbox]:
    """Up to ``limit`` frames of the sample clips as the ingest sends them (letterboxed to
    ``size``, 4:2:0 JPEG), and their letterbox (every clip is 640x480)."""
    import av

    from ingest.prepare import Preparer

    jpegs: list[bytes] = []
    letterbox: Letterbox | None = None
    for clip in CLIPS:
        prep = Preparer(*size)
        with av.open(str(clip)) as container:
            for frame in container.decode(video=0):
                done = prep.prepare(frame)
                jpegs.append(done.data)
                letterbox = done.letterbox
                if len(jpegs) >= limit:
                    break
        if len(jpegs) >= limit:
            break
    if letterbox is None:
        raise SystemExit(f"no frames in the sample clips under {SAMPLES / 'mot15'}")
    return jpegs, letterbox


def stored_frames(path: Path | None, limit: int, size: tuple[int, int]
                  ) -> tuple[list[bytes], Letterbox]:  # fmt: skip
    """:func:`encode_frames`, kept in ``path`` (``.npz``: the JPEGs end to end, their
    ends, the letterbox) when one is given: read when it holds frames of ``size``."""
    if path is not None and path.is_file():
        try:
            with np.load(path) as data:
                ends = [int(e) for e in data["ends"]]
                blob, box = data["jpegs"].tobytes(), [int(v) for v in data["letterbox"]]
                scale = float(data["scale"])
        except (OSError, ValueError, KeyError) as exc:
            raise SystemExit(
                f"--frames-file {path}: not a frames file of bench/gpu.py ({exc})"
            ) from None
        if (box[2], box[3]) == size and ends:
            jpegs = [blob[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)][:limit]
            print(f"frames: {len(jpegs)} JPEGs from {path}")
            return jpegs, Letterbox(box[0], box[1], box[2], box[3], scale, box[4], box[5])
    jpegs, lb = encode_frames(limit, size)
    if path is not None:
        box = np.array([lb.src_w, lb.src_h, lb.dst_w, lb.dst_h, lb.pad_x, lb.pad_y])
        np.savez(path, jpegs=np.frombuffer(b"".join(jpegs), np.uint8),
                 ends=np.cumsum([len(j) for j in jpegs]), scale=np.array(lb.scale),
                 letterbox=box)  # fmt: skip
        print(f"frames: {len(jpegs)} JPEGs written to {path}")
    return jpegs, lb


# -- the senders (this process) -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Load:
    tunnels: int
    streams: int
    fps: float
    inflight: int
    warmup_s: float
    seconds: float
    tracker: str


STAGES = ("decode_ms", "queue_ms", "infer_ms", "track_ms", "worker_ms")
"""The RESULT timings the tunnel run summarises: where a frame's time went in the worker."""


@dataclass(slots=True)
class Tally:
    """What happened inside the measured window [start, end), over every tunnel."""

    start: float
    end: float
    results: int = 0
    errors: int = 0
    sent: int = 0
    dropped: int = 0
    latencies_s: list[float] = field(default_factory=list)
    batches: list[float] = field(default_factory=list)
    stages_ms: dict[str, list[float]] = field(default_factory=dict)
    """The worker's own timings of each result (decode, queue, infer, track, worker)."""
    problem: str = ""
    sender_cores: float = 0.0
    """CPU of this process (the senders) over the run, in cores."""

    def inside(self) -> bool:
        return self.start <= time.monotonic() < self.end

    def record(self, event: IngestEvent) -> str | None:
        """Count one event; the stream whose credit came back, if any."""
        if isinstance(event, ProtocolViolation | PeerError):
            self.errors += 1
            self.problem = self.problem or f"worker error: {event}"
            return None
        if not isinstance(event, ResultReceived | FrameFailed):
            return None
        if self.inside():
            if isinstance(event, FrameFailed):
                self.errors += 1
                self.problem = self.problem or f"{event.code}: {event.message}"
            else:
                self.results += 1
                if event.rtt_s is not None:
                    self.latencies_s.append(event.rtt_s)
                timings = event.result.timings
                self.batches.append(timings.get("batch", 1.0))
                for stage in STAGES:
                    if stage in timings:
                        self.stages_ms.setdefault(stage, []).append(timings[stage])
        return event.stream_id


class Feed:
    """Frames of one tunnel's streams, each cycling the JPEGs from its own offset."""

    def __init__(self, jpegs: Sequence[bytes], lb: Letterbox, fps: float, names: list[str],
                 base: int = 0) -> None:  # fmt: skip
        self.jpegs, self.lb, self.names = jpegs, lb, names
        self.pts_step = round(90_000 / (fps or 25.0))
        self.seq = dict.fromkeys(names, 0)
        self.offset = {name: (37 * (base + i)) % len(jpegs) for i, name in enumerate(names)}

    def frame(self, proto: IngestProtocol, sid: str) -> bytes:
        seq = self.seq[sid]
        self.seq[sid] = seq + 1
        header = wire.Frame(
            stream_id=sid, epoch=0, seq=seq, pts=seq * self.pts_step, time_base=(1, 90_000),
            captured_at=time.time(), src_w=self.lb.src_w, src_h=self.lb.src_h, scale=self.lb.scale,
        )  # fmt: skip
        jpeg = self.jpegs[(self.offset[sid] + seq) % len(self.jpegs)]
        return proto.send_frame(header, jpeg, time.monotonic())


async def _pump(ws: ClientConnection, proto: IngestProtocol, feed: Feed, load: Load,
                tally: Tally) -> None:  # fmt: skip
    """Read results; flat out, answer each with the stream's next frame."""
    from websockets.exceptions import ConnectionClosed

    try:
        async for data in ws:
            for event in proto.receive_data(data, time.monotonic()):
                sid = tally.record(event)
                if load.fps == 0 and sid is not None and proto.can_send(sid):
                    await ws.send(feed.frame(proto, sid))
                    tally.sent += tally.inside()
    except ConnectionClosed as exc:
        tally.problem = tally.problem or f"the worker closed a tunnel: {exc}"


async def _pace(ws: ClientConnection, proto: IngestProtocol, feed: Feed, load: Load,
                tally: Tally, phase: float) -> None:  # fmt: skip
    """Each stream's frames at ``load.fps``, staggered; no credit: the frame is dropped."""
    step = 1.0 / load.fps / len(feed.names)
    t0, j = time.monotonic() + phase * step, 0
    while True:
        await asyncio.sleep(max(0.0, t0 + j * step - time.monotonic()))
        sid = feed.names[j % len(feed.names)]
        j += 1
        if proto.can_send(sid):
            await ws.send(feed.frame(proto, sid))
            tally.sent += tally.inside()
        else:
            tally.dropped += tally.inside()


async def _open(
    url: str, token: str, feed: Feed, load: Load
) -> tuple[ClientConnection, IngestProtocol]:
    from websockets.asyncio.client import connect

    ws = await connect(url, additional_headers={"Authorization": f"Bearer {token}"},
                       compression=None, max_size=None, subprotocols=versions.offer(),
                       proxy=None, close_timeout=2, open_timeout=30)  # fmt: skip
    proto = IngestProtocol(versions.accepted(ws.subprotocol))
    proto.receive_data(await ws.recv(decode=False), time.monotonic())
    for sid in feed.names:
        await ws.send(proto.open_stream(sid, CreditWindow(load.inflight, load.inflight),
                                        load.tracker))  # fmt: skip
        if load.fps == 0:
            while proto.can_send(sid):
                await ws.send(feed.frame(proto, sid))
    return ws, proto


async def run_tunnels(url: str, token: str, jpegs: Sequence[bytes], lb: Letterbox,
                      load: Load) -> tuple[Tally, wire.Hello | None]:  # fmt: skip
    """Every tunnel open, then warm-up + measured window; the tally and the HELLO."""
    names = [[f"t{t}s{s}" for s in range(load.streams)] for t in range(load.tunnels)]
    feeds = [Feed(jpegs, lb, load.fps, names[t], t * load.streams) for t in range(load.tunnels)]
    opened = [await _open(url, token, feed, load) for feed in feeds]
    now, cpu = time.monotonic(), time.process_time()
    tally = Tally(now + load.warmup_s, now + load.warmup_s + load.seconds)
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(asyncio.get_running_loop().time() + load.warmup_s
                                          + load.seconds), asyncio.TaskGroup() as tg:  # fmt: skip
                for t, ((ws, proto), feed) in enumerate(zip(opened, feeds, strict=True)):
                    tg.create_task(_pump(ws, proto, feed, load, tally))
                    if load.fps > 0:
                        tg.create_task(_pace(ws, proto, feed, load, tally, t / load.tunnels))
    finally:
        tally.sender_cores = (time.process_time() - cpu) / (time.monotonic() - now)
        await asyncio.gather(*(ws.close() for ws, _ in opened), return_exceptions=True)
    return tally, opened[0][1].hello


# -- main ---------------------------------------------------------------------------------


def bounded(kind: type[int] | type[float], lo: float, hi: float) -> Callable[[str], float]:
    """An argparse type: a finite number in [lo, hi] (NaN, inf and others: a usage error)."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (math.isfinite(value) and lo <= value <= hi):
            raise argparse.ArgumentTypeError(f"{text} is outside {lo:g}..{hi:g}")
        return value

    return parse


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[a-z_][a-z0-9_]*", key):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE with a setting's name, got {text!r}")
    return key, value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = ap.add_argument
    add("--tunnels", type=bounded(int, 1, 64), default=2, help="loopback tunnels (1-64)")
    add("--streams", type=bounded(int, 1, 1024), default=4, help="streams per tunnel (1-1024)")
    add("--fps", type=bounded(float, 0, 120), default=0.0,
        help="frames/s of each stream; 0 = flat out (default)")  # fmt: skip
    add("--inflight", type=bounded(int, 1, 64), default=2, help="credits per stream (1-64)")
    add("--seconds", type=bounded(float, 1, 600), default=6.0, help="measured, each phase")
    add("--warmup", type=bounded(float, 0, 600), default=2.0, help="not counted, each phase")
    add("--providers", choices=["auto", "tensorrt", "cuda", "cpu"], default="auto")
    add("--max-batch", type=bounded(int, 0, 256), default=0,
        help="the worker's max_batch; 0 = its auto (1 on CPU, 8 on GPU)")  # fmt: skip
    add("--batch-wait-ms", type=bounded(float, 0, 100), default=0.0)
    add("--decode-threads", type=bounded(int, 1, 64), default=2)
    add("--tracker", default="default", help="each stream's tracker (default, none, ...)")
    add("--frames", type=bounded(int, 1, MAX_FRAMES), default=MAX_FRAMES,
        help=f"distinct JPEGs cycled (1-{MAX_FRAMES})")  # fmt: skip
    add("--frames-file", type=Path, default=None,
        help="keep the JPEGs in this .npz: read it when it exists, else make them (PyAV) and "
        "write it; a machine without PyAV runs on a file made elsewhere")  # fmt: skip
    add("--model", type=Path, default=MODEL, help="an ONNX detector (416x416 YOLOX by default)")
    add("--start-timeout", type=bounded(float, 10, 1800), default=600.0,
        help="seconds for the worker to load and warm up (TensorRT builds engines)")  # fmt: skip
    add("--detector-option", type=key_value, action="append", default=[], metavar="KEY=VALUE",
        help="another OnnxDetectorSettings field (repeatable)")  # fmt: skip
    add("--worker-option", type=key_value, action="append", default=[], metavar="KEY=VALUE",
        help="another WorkerSettings field (repeatable)")  # fmt: skip
    add("--name", default="gpu", help="results in NAME.json and NAME.png")
    add("--out", type=Path, default=RESULTS, help="the folder of the results (bench/results)")
    args = ap.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", args.name):
        ap.error(f"--name: letters, digits, '-' and '_' only, got {args.name!r}")
    if not args.model.is_file():
        ap.error(f"--model: no such file: {args.model}")
    frames = args.frames_file
    if frames is not None and not frames.is_file() and not frames.parent.is_dir():
        ap.error(f"--frames-file: {frames} does not exist and its folder is missing")
    args.options = options(args)
    try:
        worker_settings("x" * 32, args.options)
    except Exception as exc:  # pydantic's ValidationError, ConfigError: one line
        ap.error(f"a setting is refused: {_first_line(exc)}")
    return args


def _first_line(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        return f"{'.'.join(map(str, first['loc']))}: {first['msg']}"
    return str(exc).splitlines()[0]


def options(args: argparse.Namespace) -> dict[str, Any]:
    """Detector and worker settings for the child (plain values, validated there again)."""
    detector = {"model": str(args.model), "providers": args.providers,
                "max_batch": args.max_batch or 8, **dict(args.detector_option)}  # fmt: skip
    in_flight = args.tunnels * args.streams * args.inflight
    worker = {"max_batch": args.max_batch, "batch_wait_ms": args.batch_wait_ms,
              "decode_threads": args.decode_threads, "max_inflight": args.inflight,
              "queue_capacity": min(4096, max(64, in_flight)), "max_refused_frames_per_s": 0,
              "max_streams_per_connection": max(256, args.streams),
              **dict(args.worker_option)}  # fmt: skip
    return {"detector": detector, "worker": worker}


def main() -> int:
    args = parse_args()
    load = Load(args.tunnels, args.streams, args.fps, args.inflight, args.warmup, args.seconds,
                args.tracker)  # fmt: skip
    gpu = GpuSampler()
    secret = secrets.token_urlsafe(32)
    token = TokenIssuer(KeySet.from_secrets([secret])).mint(
        "bench", [f"worker:{WORKER_ID}"], 3600, aud="worker"
    )
    proc, conn = start_worker(secret, args.options)
    util: dict[str, list[float]] = {"tunnel": [], "bare": []}
    try:
        ready = wait_ready(proc, conn, args.start_timeout)
        size = (ready["input"][0], ready["input"][1])
        jpegs, lb = stored_frames(args.frames_file, args.frames, size)
        url = f"ws://127.0.0.1:{ready['port']}/v1/tunnel"
        phases = 2 * (load.warmup_s + load.seconds) + min(load.warmup_s, 1.0) + load.seconds / 2
        with Progress.timed(phases, "gpu bench"):
            with gpu.sampling(util["tunnel"]):
                tally, hello = asyncio.run(run_tunnels(url, token, jpegs, lb, load))
            with gpu.sampling(util["bare"]):
                conn.send(("bare", jpegs, lb, load.warmup_s, load.seconds))
                kind, bare = answer(conn)
        conn.send(("stop",))
    finally:
        proc.join(15)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    if kind != "bare":
        raise SystemExit(f"the bare loop failed: {bare}")
    providers = list(hello.providers) if hello else ready["providers"]
    return report(args, load, ready, providers, tally, bare, gpu, util)


def percentiles(values: Sequence[float]) -> dict[str, Any]:
    """p50, p99 and every whole percentile (for the plot), in ms."""
    if not values:
        return {"p50": math.nan, "p99": math.nan}
    ms = np.asarray(values) * 1000.0
    every = np.percentile(ms, np.arange(101))
    return {"p50": float(every[50]), "p99": float(every[99]), "every": every.tolist()}


def gpu_line(gpu: GpuSampler, providers: Sequence[str], util: dict[str, list[float]]) -> str:
    """What the GPU did; never a GPU claim where there is none, or where none was used."""
    on_gpu = any(not p.startswith("CPU") for p in providers)
    if gpu.name is None:
        return f"{CPU_ONLY} ({gpu.reason})" if not on_gpu else f"GPU not readable ({gpu.reason})"
    if not on_gpu:
        return f"{gpu.name} present, but the worker ran on {', '.join(providers)}: CPU figures"
    means = {k: f"{np.mean(v):.0f} %" if v else "n/a" for k, v in util.items()}
    return f"{gpu.name}, mean utilisation {means['tunnel']} (tunnel), {means['bare']} (bare)"


def verdict(ratio: float, fps: float, offered: float) -> str:
    """ok / BELOW; not judged where a paced load was carried in full (it bounds the ratio)."""
    if offered and fps >= 0.95 * offered:
        return (f"not judged: the offered {offered:g} frames/s were carried in full "
                "(--fps 0 measures capacity)")  # fmt: skip
    return "ok" if ratio >= TARGET_RATIO else "BELOW"


def report(args: argparse.Namespace, load: Load, ready: dict[str, Any], providers: list[str],
           tally: Tally, bare: dict[str, float], gpu: GpuSampler,
           util: dict[str, list[float]]) -> int:  # fmt: skip
    fps = tally.results / load.seconds
    ratio = fps / bare["bare_fps"] if bare["bare_fps"] else 0.0
    lat = percentiles(tally.latencies_s)
    batch = float(np.mean(tally.batches)) if tally.batches else 0.0
    w, h = ready["input"]
    pace = f"{load.fps:g} fps each" if load.fps else "flat out"
    print(f"model {args.model.name} ({w}x{h}); batch {ready['batch']} (mean {batch:.1f} in the "
          f"tunnel run); providers {', '.join(providers)}")  # fmt: skip
    if ready["acceleration"]:
        print("engine: " + ", ".join(f"{k} {v}" for k, v in ready["acceleration"].items()))
    print(f"GPU: {gpu_line(gpu, providers, util)}")
    print(f"{load.tunnels} tunnels x {load.streams} streams ({pace}, {load.inflight} credits "
          f"each), {load.seconds:g} s after {load.warmup_s:g} s:")  # fmt: skip
    print(f"  tunnel (end to end)   {fps:9.1f} frames/s   latency p50 {lat['p50']:.1f} ms, "
          f"p99 {lat['p99']:.1f} ms")  # fmt: skip
    stages = {k.removesuffix("_ms"): percentiles([v / 1000 for v in vals])
              for k, vals in tally.stages_ms.items()}  # fmt: skip
    if stages:
        print("  in the worker, p50/p99 ms: " + ", ".join(
            f"{k} {v['p50']:.1f}/{v['p99']:.1f}" for k, v in stages.items()))  # fmt: skip
    print(f"  bare (decode + infer) {bare['bare_fps']:9.1f} frames/s")
    print(f"  model only            {bare['model_fps']:9.1f} frames/s")
    offered = load.tunnels * load.streams * load.fps
    print(f"  ratio tunnel / bare {ratio:.2f} (target >= {TARGET_RATIO}): "
          f"{verdict(ratio, fps, offered)}")  # fmt: skip
    print(f"  sent {tally.sent / load.seconds:.1f} frames/s, dropped (no credit) {tally.dropped}, "
          f"errors {tally.errors}")  # fmt: skip
    busy = " (one Python process: near 1 core the senders bound the figure)"
    print(f"  the senders used {tally.sender_cores:.2f} CPU cores"
          f"{busy if tally.sender_cores > 0.8 else ''}")  # fmt: skip
    if tally.problem:
        print(f"  first problem: {tally.problem}")
    write_results(args.name, {
        "model": args.model.name, "input": [w, h], "batch": ready["batch"], "mean_batch": batch,
        "providers": providers, "acceleration": ready["acceleration"], "gpu": gpu.name,
        "gpu_note": gpu_line(gpu, providers, util),
        "gpu_util_pct": {k: (float(np.mean(v)) if v else None) for k, v in util.items()},
        "tunnels": load.tunnels, "streams": load.streams, "fps": load.fps,
        "inflight": load.inflight, "seconds": load.seconds, "warmup": load.warmup_s,
        "tracker": load.tracker, "decode_threads": args.decode_threads,
        "batch_wait_ms": args.batch_wait_ms, "frames": args.frames,
        "tunnel_fps": fps, "bare_fps": bare["bare_fps"], "model_fps": bare["model_fps"],
        "ratio": ratio, "offered_fps": offered, "latency_ms": lat,
        "worker_stages_ms": {k: {q: v[q] for q in ("p50", "p99")} for k, v in stages.items()},
        "sent_fps": tally.sent / load.seconds, "dropped": tally.dropped,
        "errors": tally.errors, "problem": tally.problem, "sender_cores": tally.sender_cores,
    }, plot, folder=args.out)  # fmt: skip
    return 0 if tally.results else 1


def plot(fig: Figure, results: dict[str, Any]) -> None:
    """Frames/s of the three runs with the ratio; the latency distribution (CDF)."""
    runs, cdf = fig.subplots(1, 2, width_ratios=(1, 1.2))
    names = ["tunnel\n(end to end)", "bare\n(decode + infer)", "model only"]
    values = [results["tunnel_fps"], results["bare_fps"], results["model_fps"]]
    runs.bar(names, values, color=["tab:blue", "tab:orange", "tab:gray"])
    runs.tick_params(axis="x", labelsize="small")
    where = results["gpu"] or "CPU"
    runs.set(ylabel="frames / s", title=f"tunnel / bare {results['ratio']:.2f} ({where}, "
             f"batch {results['batch']})")  # fmt: skip
    every = results["latency_ms"].get("every")
    if every:
        cdf.plot(every, range(101))
        for name in ("p50", "p99"):
            cdf.axvline(results["latency_ms"][name], ls=":", color="tab:gray")
    load = f"{results['tunnels']} x {results['streams']} streams"
    cdf.set(xlabel="FRAME sent -> RESULT back (ms)", ylabel="percentile",
            title=f"latency, {load}, {results['model']}")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
