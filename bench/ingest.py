"""Ingest CPU cost per 720p frame against ``ffmpeg -benchmark`` decoding the same file.

    python bench/ingest.py [--repeat 3] [--seconds 36] [--validate-seconds 15]

Makes a 720p30 H.264 clip from the sample (scaled, re-timed to 30 fps, looped;
GOP 2 s, no B-frames, like a camera) into ``.cache/bench-ingest/`` and measures
CPU seconds (user + system, all threads) per decoded frame of:

* **ffmpeg**: ``ffmpeg -benchmark -i clip -f null -`` (decode only; baseline);
* **decode**: the ingest's own source (``AVSource.session``, PyAV, thread_type
  AUTO), frames dropped at once - the ratio decode/ffmpeg is the figure the
  issue targets (<= 1.15);
* **full@all**: decode + timeline + sampling + letterbox + JPEG of *every*
  frame (416x416 model input), through a real ``IngestStream`` and its mailbox;
* **full@5fps**: the same sampling 5 of every 30 frames (a camera stream).

From full@5fps it derives how many 720p30 streams one core sustains, then
checks that figure by running that many real-time streams in a process pinned
to one core (``--validate-seconds``, 0 to skip). Runs alternate; medians are
reported. Writes ``bench/results/ingest.json`` and ``ingest.png`` (CPU per frame
of each path against ffmpeg; the real-time checks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._progress import Progress  # noqa: E402
from bench._results import write_results  # noqa: E402
from framerelay.settings import DEFAULT_CLIP  # noqa: E402
from ingest.handoff import SlotClosed  # noqa: E402
from ingest.settings import StreamConfig  # noqa: E402
from ingest.source import AVSource, Decoded, SourceSpec  # noqa: E402
from ingest.stream import IngestStream  # noqa: E402

CACHE = ROOT / ".cache" / "bench-ingest"
MODEL_INPUT = (416, 416)
_BENCH = re.compile(r"bench: utime=([\d.]+)s stime=([\d.]+)s rtime=([\d.]+)s")


def make_clip(seconds: float) -> Path:
    """720p30 H.264 (CRF 23, GOP 60, no B-frames) from the sample clip, looped."""
    out = CACHE / f"clip-720p30-{int(seconds)}s.mp4"
    if not out.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp.mp4")
        subprocess.run(
            ["ffmpeg", "-hide_banner", "-loglevel", "error", "-nostdin", "-y",
             "-stream_loop", "-1", "-i", str(DEFAULT_CLIP),
             "-vf", "scale=1280:720,setpts=N/(30*TB)", "-r", "30", "-t", str(seconds),
             "-c:v", "libx264", "-preset", "veryfast", "-crf", "23", "-g", "60", "-bf", "0",
             "-pix_fmt", "yuv420p", "-movflags", "+faststart", str(tmp)],
            check=True, timeout=600,
        )  # fmt: skip
        tmp.rename(out)
    return out


def count_frames(clip: Path) -> int:
    n = 0
    spec = SourceSpec.from_config(StreamConfig(id="n", url=str(clip)))

    def on_frame(_: Decoded) -> bool:
        nonlocal n
        n += 1
        return True

    AVSource(spec).session(threading.Event(), lambda _: None, on_frame)
    return n


def ffmpeg_cpu(clip: Path) -> float:
    """CPU seconds of ``ffmpeg -benchmark`` decoding the whole clip."""
    run = subprocess.run(
        ["ffmpeg", "-hide_banner", "-nostdin", "-benchmark", "-i", str(clip), "-an",
         "-f", "null", "-"],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    match = _BENCH.search(run.stderr)
    if match is None:
        raise RuntimeError(f"no 'bench:' line from ffmpeg: {run.stderr[-500:]}")
    return float(match[1]) + float(match[2])


def decode_cpu(clip: Path) -> float:
    """CPU seconds of the ingest's source decoding the whole clip (frames dropped)."""
    spec = SourceSpec.from_config(StreamConfig(id="d", url=str(clip)))
    t0 = time.process_time()
    AVSource(spec).session(threading.Event(), lambda _: None, lambda _: True)
    return time.process_time() - t0


async def _full(clip: Path, fps: float) -> tuple[float, dict[str, int]]:
    cfg = StreamConfig(id="f", url=str(clip), fps=fps)
    stream = IngestStream(cfg, asyncio.get_running_loop(), 4)
    t0 = time.process_time()
    stream.start(*MODEL_INPUT)
    try:
        while True:
            await stream.slot.get()  # taken at once: the cost of the ingest side alone
    except SlotClosed:
        pass
    await asyncio.to_thread(stream.join, 60)
    return time.process_time() - t0, dict(stream.counters)


def full_cpu(clip: Path, fps: float) -> tuple[float, dict[str, int]]:
    return asyncio.run(_full(clip, fps))


def validate(clip: Path, streams: int, seconds: float) -> dict[str, Any]:
    """Run ``streams`` real-time streams (5 fps sampling) in a child pinned to one core."""
    code = (
        "import asyncio, json, os, sys, time\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "from bench.ingest import run_realtime\n"
        f"print(json.dumps(asyncio.run(run_realtime({str(clip)!r}, {streams}, {seconds}))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        timeout=seconds + 120,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


async def run_realtime(clip: str, streams: int, seconds: float) -> dict[str, Any]:
    """``streams`` paced (live-like) streams for ``seconds``: decoded fps and CPU share."""
    loop = asyncio.get_running_loop()
    live = [
        IngestStream(StreamConfig(id=f"s{i}", url=clip, fps=5, realtime=True, loop=True), loop, 4)
        for i in range(streams)
    ]

    async def take(s: IngestStream) -> None:
        try:
            while True:
                await s.slot.get()
        except SlotClosed:
            return

    takers = [asyncio.create_task(take(s)) for s in live]
    for s in live:
        s.start(*MODEL_INPUT)
    await asyncio.sleep(5.0)  # warm-up: open, first GOP, catch-up of the start
    d0, c0, t0 = [s.counters["decoded"] for s in live], time.process_time(), time.monotonic()
    await asyncio.sleep(seconds)
    d1, c1, t1 = [s.counters["decoded"] for s in live], time.process_time(), time.monotonic()
    for s in live:
        s.stop()
    await asyncio.gather(*takers)
    for s in live:
        await asyncio.to_thread(s.join, 30)
    rates = [(b - a) / (t1 - t0) for a, b in zip(d0, d1, strict=True)]
    return {"streams": streams, "fps_min": min(rates), "fps_mean": statistics.mean(rates),
            "cpu_share": (c1 - c0) / (t1 - t0)}  # fmt: skip


KEEP_UP = 0.97
"""A stream keeps up when its slowest decoded rate is at least this share of 30 fps."""


def search_sustained(clip: Path, start: int, seconds: float) -> list[dict[str, Any]]:
    """Check the computed figure with real streams on one core, stepping down until all
    of them keep up (at most 3 runs)."""
    checks: list[dict[str, Any]] = []
    n = start
    while seconds > 0 and n > 0 and len(checks) < 3:
        check = validate(clip, n, seconds)
        check["keeps_up"] = check["fps_min"] >= KEEP_UP * 30
        checks.append(check)
        verdict = "keeps up" if check["keeps_up"] else "behind"
        print(f"check: {n} real-time streams pinned to one core decoded {check['fps_min']:.1f} "
              f"fps (slowest), {check['fps_mean']:.1f} fps (mean) of 30, using "
              f"{check['cpu_share']:.2f} core: {verdict}")  # fmt: skip
        if check["keeps_up"]:
            break
        n -= 1
    return checks


def measure(clip: Path, repeat: int) -> dict[str, list[float]]:
    runs: dict[str, list[float]] = {"ffmpeg": [], "decode": [], "full@all": [], "full@5fps": []}
    with Progress(4 * repeat, "ingest", "measurements") as bar:
        for _ in range(repeat):  # alternate, so load from other jobs hits all alike
            for path, cpu in (("ffmpeg", ffmpeg_cpu), ("decode", decode_cpu),
                              ("full@all", lambda c: full_cpu(c, 0)[0]),
                              ("full@5fps", lambda c: full_cpu(c, 5)[0])):  # fmt: skip
                runs[path].append(cpu(clip))
                bar.advance()
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs of each path (1-20)")
    parser.add_argument("--seconds", type=float, default=36.0,
                        help="length of the 720p30 clip (2-600)")  # fmt: skip
    parser.add_argument("--validate-seconds", type=float, default=15.0,
                        help="each real-time check on one core (0: none; at most 600)")  # fmt: skip
    args = parser.parse_args()
    if not (1 <= args.repeat <= 20 and 2 <= args.seconds <= 600
            and 0 <= args.validate_seconds <= 600):  # fmt: skip
        parser.error("--repeat must be 1-20, --seconds 2-600, --validate-seconds 0-600")
    clip = make_clip(args.seconds)
    frames = count_frames(clip)
    runs = measure(clip, args.repeat)
    ms = {k: 1000 * statistics.median(v) / frames for k, v in runs.items()}
    ratio = {k: ms[k] / ms["ffmpeg"] for k in ms}
    per_stream_core = 30 * ms["full@5fps"] / 1000  # core-seconds per second of one stream
    sustained = int(1 / per_stream_core)
    print(f"clip: {clip.name}, {frames} frames 1280x720 @30 fps, {os.cpu_count()} cores")
    print(f"{'path':<11}{'CPU ms/frame':>14}{'x ffmpeg':>10}   runs (CPU s)")
    for k in runs:
        cells = " ".join(f"{v:.2f}" for v in runs[k])
        print(f"{k:<11}{ms[k]:>14.3f}{ratio[k]:>10.2f}   {cells}")
    print(f"decode/ffmpeg = {ratio['decode']:.2f} (target <= 1.15); full path at 5 fps "
          f"sampling = {ratio['full@5fps']:.2f}, encoding every frame = "
          f"{ratio['full@all']:.2f}")  # fmt: skip
    print(f"one 720p30 stream sampled at 5 fps uses {per_stream_core:.3f} core: "
          f"one core sustains {1 / per_stream_core:.1f} -> {sustained} streams")  # fmt: skip
    checks = search_sustained(clip, sustained, args.validate_seconds)
    write_results("ingest", {
        "clip": clip.name, "frames": frames, "cpu_s": runs, "cpu_ms_per_frame": ms,
        "ratio_vs_ffmpeg": ratio, "streams_per_core": 1 / per_stream_core, "checks": checks,
    }, plot)  # fmt: skip
    return 0


def plot(fig: Figure, results: dict[str, Any]) -> None:
    """CPU ms per frame of each path (x ffmpeg); the real-time checks on one core."""
    checks = results["checks"]
    cpu, *rest = fig.subplots(1, 2 if checks else 1, squeeze=False)[0]
    paths = list(results["cpu_ms_per_frame"])
    colors = ["tab:gray", "tab:blue", "tab:orange", "tab:green"][: len(paths)]
    bars = cpu.bar(paths, [results["cpu_ms_per_frame"][p] for p in paths], color=colors)
    cpu.bar_label(bars, [f"{results['ratio_vs_ffmpeg'][p]:.2f}x" for p in paths])
    cpu.set(ylabel="CPU ms per decoded 720p frame", title=f"{results['clip']}, vs ffmpeg")
    if rest:
        ax = rest[0]
        labels = [f"{c['streams']} streams" for c in checks]
        ax.bar(labels, [c["fps_min"] for c in checks], color="tab:green", label="slowest stream")
        ax.axhline(30 * KEEP_UP, color="tab:red", ls="--", label=f"keeps up ({KEEP_UP:.0%} of 30)")
        ax.set(ylabel="decoded fps", ylim=(0, 36), title="real-time streams on one core")
        ax.legend(loc="lower right")


if __name__ == "__main__":
    sys.exit(main())
