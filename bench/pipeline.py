"""Pipeline vs bare ONNX Runtime on the same clip, model and threads.

    python bench/pipeline.py [--frames 537] [--repeat 3] [--threads 2]

* **bare**: one process decodes the clip with PyAV, letterboxes each frame and
  runs the detector (the same ``OnnxDetector``, batch 1) in a plain loop.
* **pipeline**: the real thing: a ``framerelay worker`` process, an ingest
  (decode, YUV letterbox, JPEG, tunnel with credits) on loopback, tracking,
  results back, every frame (lossless file mode).

Both run on this machine's cores at the same time budget; runs alternate and
the medians are compared. Prints frames/s of both, the ratio pipeline/bare,
and per-stage p50/p99 from the results' timings. Writes
``bench/results/pipeline.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import time
from pathlib import Path

import av
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from framerelay.geometry import PAD_VALUE, Letterbox  # noqa: E402
from framerelay.results import ResultRecord  # noqa: E402
from framerelay.settings import DEFAULT_CLIP, DEFAULT_MODEL  # noqa: E402
from gpu_worker.detectors import ModelInput, load_detector, settings_for_model  # noqa: E402
from gpu_worker.launcher import LocalWorker  # noqa: E402
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
    url: str, secret: str, clip: Path, frames: int
) -> tuple[float, list[ResultRecord]]:
    cfg = StreamConfig(id="bench", url=str(clip), fps=0, loop=True, max_frames=frames)
    service = IngestService(
        IngestSettings(worker_url=url, token_secrets=secret, worker_id="bench", streams=[cfg])
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
    args = ap.parse_args()
    secret = secrets.token_urlsafe(32)
    bare_fps: list[float] = []
    pipe_fps: list[float] = []
    last: list[ResultRecord] = []
    with LocalWorker(secret, worker_id="bench", args=["--threads", str(args.threads)]) as worker:
        asyncio.run(pipeline(worker.url, secret, args.clip, 60))  # warm the worker's allocator
        for i in range(args.repeat):
            bare_fps.append(bare(args.clip, args.frames, args.threads))
            fps, last = asyncio.run(pipeline(worker.url, secret, args.clip, args.frames))
            pipe_fps.append(fps)
            print(
                f"run {i + 1}: bare {bare_fps[-1]:6.1f} fps   pipeline {fps:6.1f} fps", flush=True
            )
    b, p = statistics.median(bare_fps), statistics.median(pipe_fps)
    per_stage = stages(last)
    print(
        f"\nmedian of {args.repeat} runs, {args.frames} frames, {args.threads} inference threads:"
    )
    print(f"  bare onnxruntime loop   {b:7.1f} frames/s")
    print(f"  full pipeline           {p:7.1f} frames/s")
    print(f"  ratio pipeline / bare   {p / b:7.2f}")
    print("\nper-stage ms (last pipeline run)      p50      p99")
    for k, v in per_stage.items():
        print(f"  {k:32s} {v['p50']:8.2f} {v['p99']:8.2f}")
    out = ROOT / "bench" / "results" / "pipeline.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "bare_fps": bare_fps,
                "pipeline_fps": pipe_fps,
                "ratio": p / b,
                "frames": args.frames,
                "threads": args.threads,
                "stages": per_stage,
            },
            indent=2,
        )
    )
    print(f"\nwrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
