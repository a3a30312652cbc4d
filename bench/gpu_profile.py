"""Where one batch spends its time in the worker's detector, and what a new thread costs.

    python bench/gpu_profile.py [--providers cuda] [--batch 64] [--runs 20]

Three parts, each printed as it finishes (and written to ``bench/results/<--name>.json``):

1. **breakdown** of ``OnnxDetector.infer`` on one batch of the sample frames, after
   ``prepare()``: building the input (``np.stack``), the whole run (upload, graph,
   download), the upload alone, the graph alone with its input already on the device
   (IO binding), in ms per batch (mean of ``--runs``).
2. **threads**: the first run of each batch bucket in a thread that has never run the
   model, against the same run again in that thread. On the H200 the worker's inference
   thread stalled for seconds per run while the GPU idled, and the bare loop in another
   thread did not: this part says whether ONNX Runtime's first runs are per thread.
3. **nvImageCodec** (where it imports and a GPU is seen): one batch decode of the JPEGs,
   and copying the decoded images back to the host, per decoder backend.

The frames come from ``--frames-file`` (see ``bench/gpu.py``) or are made with PyAV.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench._results import RESULTS, write_results  # noqa: E402
from bench.gpu import MODEL, stored_frames  # noqa: E402
from gpu_worker.detectors import ModelInput, load_detector, settings_for_model  # noqa: E402
from gpu_worker.detectors.onnx_backend import OnnxDetector  # noqa: E402
from gpu_worker.images import decode_jpeg_bgr  # noqa: E402


def mean_ms(fn: Callable[[], object], runs: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.fmean(times)


def breakdown(det: OnnxDetector, batch: list[ModelInput], runs: int) -> dict[str, float]:
    import onnxruntime as ort

    tensor = det._to_tensor(batch, len(batch))
    out = {
        "infer": mean_ms(lambda: det.infer(batch), runs),
        "stack": mean_ms(lambda: det._to_tensor(batch, len(batch)), runs),
    }
    device = "cuda" if any(p.startswith("CUDA") for p in det.providers) else "cpu"
    out["upload"] = mean_ms(lambda: ort.OrtValue.ortvalue_from_numpy(tensor, device, 0), runs)
    session = det._session
    binding = session.io_binding()
    binding.bind_ortvalue_input(session.get_inputs()[0].name,
                                ort.OrtValue.ortvalue_from_numpy(tensor, device, 0))  # fmt: skip
    for output in session.get_outputs():
        binding.bind_output(output.name, device, 0)
    out["graph_on_device"] = mean_ms(lambda: session.run_with_iobinding(binding), runs)
    return out


def first_runs_in_a_new_thread(det: OnnxDetector, batch: list[ModelInput]) -> dict[str, Any]:
    """Per bucket: the first run in a fresh thread, then the second, in ms."""
    sizes = det.acceleration.batch_buckets or (len(batch),)
    got: dict[str, Any] = {}

    def work() -> None:
        for size in sizes:
            chunk = (batch * (size // len(batch) + 1))[:size]
            first = mean_ms(lambda c=chunk: det.infer(c), 1, warmup=0)  # type: ignore[misc]
            again = mean_ms(lambda c=chunk: det.infer(c), 1, warmup=0)  # type: ignore[misc]
            got[str(size)] = {"first_ms": first, "again_ms": again}

    thread = threading.Thread(target=work, name="fresh")
    thread.start()
    thread.join()
    return got


def nvimgcodec_decode(jpegs: list[bytes], runs: int) -> dict[str, Any]:
    try:
        import nvidia.nvimgcodec as nv
    except Exception as exc:  # not installed, or its CUDA libraries missing
        return {"skipped": f"nvImageCodec does not load: {exc}"}
    out: dict[str, Any] = {}
    params = nv.DecodeParams(apply_exif_orientation=False)
    for name in ("default", "HW_GPU_ONLY", "GPU_ONLY", "HYBRID_CPU_GPU"):
        try:
            kind = getattr(nv.BackendKind, name, None) if name != "default" else None
            decoder = nv.Decoder(backends=[nv.Backend(kind)]) if kind else nv.Decoder()
            images = decoder.decode(jpegs, params=params)
            decode = mean_ms(lambda d=decoder: d.decode(jpegs, params=params), runs)  # type: ignore[misc]
            host = mean_ms(lambda im=images: [np.asarray(i.cpu()) for i in im], runs)  # type: ignore[misc]
            out[name] = {"decode_ms": decode, "to_host_ms": host}
        except Exception as exc:  # a backend this GPU or build lacks
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--providers", choices=["auto", "tensorrt", "cuda", "cpu"], default="auto")
    ap.add_argument("--batch", type=int, default=64, help="images per batch (1-256)")
    ap.add_argument("--runs", type=int, default=20, help="timed runs per figure (1-1000)")
    ap.add_argument("--frames-file", type=Path, default=None, help="as bench/gpu.py's")
    ap.add_argument("--name", default="gpu-profile")
    ap.add_argument("--out", type=Path, default=RESULTS, help="the folder of the results")
    args = ap.parse_args()
    if not (1 <= args.batch <= 256 and 1 <= args.runs <= 1000):
        ap.error("--batch must be 1-256 and --runs 1-1000")
    frames = args.frames_file
    if frames is not None and not frames.is_file() and not frames.parent.is_dir():
        ap.error(f"--frames-file: {frames} does not exist and its folder is missing")
    det = load_detector(settings_for_model(MODEL, providers=args.providers, max_batch=args.batch))
    assert isinstance(det, OnnxDetector)  # the sample model is ONNX
    w, h = det.input_size
    jpegs, lb = stored_frames(args.frames_file, max(args.batch, 8), (w, h))
    batch = [ModelInput(decode_jpeg_bgr(j, w, h), lb) for j in jpegs[: args.batch]]
    print(f"model {MODEL.name}, batch {args.batch}, providers {', '.join(det.providers)}, "
          f"{det.acceleration.as_info()}")  # fmt: skip
    results: dict[str, Any] = {"providers": list(det.providers), "batch": args.batch}
    started = time.perf_counter()
    det.prepare()
    results["prepare_s"] = time.perf_counter() - started
    print(f"prepare (every batch bucket once): {results['prepare_s']:.1f} s")
    results["threads"] = first_runs_in_a_new_thread(det, batch)
    for size, t in results["threads"].items():
        print(f"  new thread, batch {size}: first run {t['first_ms']:.1f} ms, "
              f"again {t['again_ms']:.1f} ms")  # fmt: skip
    results["breakdown_ms"] = breakdown(det, batch, args.runs)
    print("one batch, ms: " + ", ".join(f"{k} {v:.2f}" for k, v in results["breakdown_ms"].items()))
    results["nvimgcodec"] = nvimgcodec_decode(jpegs[: args.batch], args.runs)
    print(f"nvImageCodec: {results['nvimgcodec']}")
    write_results(args.name, results, None, folder=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
