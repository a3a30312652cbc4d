"""Pipeline vs bare ONNX Runtime on the same clip, model and threads.

    python bench/pipeline.py [--frames 537] [--repeat 3] [--threads 2] [--tls]

* **bare**: one process decodes the clip with PyAV, letterboxes each frame and
  runs the detector (the same ``OnnxDetector``, batch 1) in a plain loop.
* **pipeline**: the real thing: a ``framerelay worker`` process, an ingest
  (decode, YUV letterbox, JPEG, tunnel with credits) on loopback, tracking,
  results back, every frame (lossless file mode).

Both run on this machine's cores at the same time budget; runs alternate and
the medians are compared. With ``--tls`` a second worker runs as across clouds
(``wss://`` with a certificate from the orchestrator's CA, verified by the
ingest; EdDSA tunnel tokens against the public key set) and its pipeline runs
alternate with the plain one's: both ratios are printed. Prints frames/s of
both, the ratio pipeline/bare,
and per-stage p50/p99 from the results' timings. Writes
``bench/results/pipeline.json`` and ``pipeline.png`` (frames/s of each run and
the ratios; the stages' p50/p99).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import av
import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._progress import Progress  # noqa: E402
from bench._results import write_results  # noqa: E402
from bench._trust import make_trust  # noqa: E402
from framerelay.geometry import PAD_VALUE, Letterbox  # noqa: E402
from framerelay.launcher import LocalWorker  # noqa: E402
from framerelay.results import ResultRecord  # noqa: E402
from framerelay.settings import DEFAULT_CLIP, DEFAULT_MODEL  # noqa: E402
from gpu_worker.detectors import ModelInput, load_detector, settings_for_model  # noqa: E402
from ingest.service import IngestService  # noqa: E402
from ingest.settings import IngestSettings, StreamConfig  # noqa: E402


def bare(clip: Path, frames: int, threads: int) -> float:
    det = load_detector(settings_for_model(DEFAULT_MODEL, threads=threads, max_batch=1))
    w, h = det.input_size
    det.infer([ModelInput(np.full((h, w, 3), PAD_VALUE, np.uint8), Letterbox.fit(w, h, w, h))])
    done, started = 0, time.perf_counter()
    while done < frames:
        with av.open(str(clip)) as c:
            stream = c.streams.video[0]
            stream.thread_type = "AUTO"
            for frame in c.decode(stream):
                lb = Letterbox.fit(frame.width, frame.height, w, h)
                canvas = np.full((h, w, 3), PAD_VALUE, np.uint8)
                canvas[: lb.new_h, : lb.new_w] = frame.reformat(
                    lb.new_w, lb.new_h, format="bgr24"
                ).to_ndarray()
                det.infer([ModelInput(canvas, lb)])
                done += 1
                if done >= frames:
                    break
    return done / (time.perf_counter() - started)


async def pipeline(
    url: str, auth: dict[str, Any], clip: Path, frames: int
) -> tuple[float, list[ResultRecord]]:
    cfg = StreamConfig(id="bench", url=str(clip), fps=0, loop=True, max_frames=frames)
    service = IngestService(
        IngestSettings(worker_url=url, worker_id="bench", streams=[cfg], **auth)
    )
    got: list[ResultRecord] = []
    service.bus.tap(got.append)
    started = time.perf_counter()
    await service.run(asyncio.Event(), until_finished=True)
    elapsed = time.perf_counter() - started
    assert len(got) == frames, f"{len(got)} results for {frames} frames"
    return frames / elapsed, got


def stages(results: list[ResultRecord]) -> dict[str, dict[str, float]]:
    out = {}
    keys = [k for k in results[0].timings if k != "batch"] + ["latency_ms"]
    for k in keys:
        vals = [r.latency_ms if k == "latency_ms" else r.timings[k] for r in results]
        out[k] = {"p50": float(np.percentile(vals, 50)), "p99": float(np.percentile(vals, 99))}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--clip", type=Path, default=DEFAULT_CLIP)
    ap.add_argument("--frames", type=int, default=537, help="frames per run (the clip loops)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="inference threads on both sides")
    ap.add_argument("--tls", action="store_true", help="also run over verified wss:// + EdDSA")
    args = ap.parse_args()
    if not args.clip.is_file():
        ap.error(f"--clip: no such file: {args.clip}")
    if args.frames < 1 or args.repeat < 1 or args.threads < 1:
        ap.error("--frames, --repeat and --threads must be at least 1")
    secret = secrets.token_urlsafe(32)
    bare_fps: list[float] = []
    pipe_fps: dict[str, list[float]] = {"ws": []}
    last: list[ResultRecord] = []
    worker_args = ["--threads", str(args.threads)]
    with ExitStack() as stack:
        plain = stack.enter_context(LocalWorker(secret, worker_id="bench", args=worker_args))
        modes: dict[str, tuple[str, dict[str, Any]]] = {
            "ws": (plain.url, {"token_secrets": secret})
        }
        if args.tls:
            trust = make_trust(Path(stack.enter_context(tempfile.TemporaryDirectory())))
            tls = stack.enter_context(
                LocalWorker(worker_id="bench", args=worker_args, env=trust.worker_env())
            )
            modes["wss"] = (tls.url, trust.ingest_settings())
            pipe_fps["wss"] = []
        for url, auth in modes.values():
            asyncio.run(pipeline(url, auth, args.clip, 60))  # warm the worker's allocator
        bar = stack.enter_context(Progress(args.repeat, "pipeline", "runs"))
        for i in range(args.repeat):
            bare_fps.append(bare(args.clip, args.frames, args.threads))
            line = f"run {i + 1}: bare {bare_fps[-1]:6.1f} fps"
            for name, (url, auth) in modes.items():
                fps, last = asyncio.run(pipeline(url, auth, args.clip, args.frames))
                pipe_fps[name].append(fps)
                line += f"   pipeline/{name} {fps:6.1f} fps"
            print(line, flush=True)
            bar.advance()
    return report(args, bare_fps, pipe_fps, last)


def report(
    args: argparse.Namespace,
    bare_fps: list[float],
    pipe_fps: dict[str, list[float]],
    last: list[ResultRecord],
) -> int:
    b = statistics.median(bare_fps)
    ratios = {name: statistics.median(v) / b for name, v in pipe_fps.items()}
    per_stage = stages(last)
    print(
        f"\nmedian of {args.repeat} runs, {args.frames} frames, {args.threads} inference threads:"
    )
    print(f"  bare onnxruntime loop   {b:7.1f} frames/s")
    for name, v in pipe_fps.items():
        print(f"  full pipeline ({name:3s})     {statistics.median(v):7.1f} frames/s   "
              f"ratio pipeline / bare {ratios[name]:5.2f}")  # fmt: skip
    print("\nper-stage ms (last pipeline run)      p50      p99")
    for k, pcts in per_stage.items():
        print(f"  {k:32s} {pcts['p50']:8.2f} {pcts['p99']:8.2f}")
    write_results("pipeline", {
        "bare_fps": bare_fps, "pipeline_fps": pipe_fps["ws"], "ratio": ratios["ws"],
        "pipeline_fps_by_mode": pipe_fps, "ratios": ratios, "frames": args.frames,
        "threads": args.threads, "stages": per_stage,
    }, plot)  # fmt: skip
    return 0


def plot(fig: Figure, results: dict[str, Any]) -> None:
    """Frames/s of each run (bare vs each pipeline) with the median ratios; stage p50/p99."""
    runs, stage = fig.subplots(1, 2, width_ratios=(1, 1.3))
    series = {"bare onnxruntime": results["bare_fps"]} | {
        f"pipeline ({mode})": fps for mode, fps in results["pipeline_fps_by_mode"].items()
    }
    width = 0.8 / len(series)
    for k, (name, fps) in enumerate(series.items()):
        runs.bar([i + k * width for i in range(len(fps))], fps, width, label=name)
    runs.set_xticks([i + 0.4 - width / 2 for i in range(len(results["bare_fps"]))],
                    [f"run {i + 1}" for i in range(len(results["bare_fps"]))])  # fmt: skip
    ratios = ", ".join(f"{m} {r:.2f}" for m, r in results["ratios"].items())
    runs.set(ylabel="frames / s", title=f"pipeline / bare (median): {ratios}")
    runs.set_ylim(0, 1.25 * max(max(v) for v in series.values()))
    runs.legend(loc="upper center", ncols=len(series))
    names = list(results["stages"])
    ys = range(len(names))
    stage.barh([y - 0.2 for y in ys], [results["stages"][n]["p50"] for n in names], 0.4,
               label="p50")  # fmt: skip
    stage.barh([y + 0.2 for y in ys], [results["stages"][n]["p99"] for n in names], 0.4,
               label="p99")  # fmt: skip
    stage.set_yticks(list(ys), names)
    stage.invert_yaxis()  # in the pipeline's order, top down
    stage.set(xlabel="ms (last pipeline run)", title="per stage")
    stage.legend()


if __name__ == "__main__":
    raise SystemExit(main())
