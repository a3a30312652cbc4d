"""``bench/gpu.py`` on the CPU provider, tiny, and ``scripts/gpu-check.sh`` checked dry.

Issue 14: where no GPU is present, the GPU bench still runs end to end against
the CPU provider (the real worker process, the real model, real tunnels on
127.0.0.1) and says plainly that no GPU was used; the GPU check script parses
and lists its steps without installing, running or writing anything. The GPU
figures themselves come only from the script on a GPU machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TIMEOUT_FACTOR

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
STEPS = ("gpu", "venv", "install", "versions", "engine", "tests", "profile", "bench-flat", "bench",
         "summary")  # fmt: skip
TINY = ["--providers", "cpu", "--tunnels", "1", "--streams", "2", "--seconds", "2",
        "--warmup", "0.5", "--frames", "20", "--decode-threads", "1"]  # fmt: skip


def _gpu_present() -> bool:
    from gpu_worker.gpu_stats import read_gpus

    return read_gpus().available


@pytest.mark.integration
def test_the_cpu_run_prints_and_writes_its_figures_and_says_no_gpu(tmp_path: Path) -> None:
    frames = tmp_path / "frames.npz"  # made (PyAV) and kept: a GPU box without PyAV reads it
    args = [*TINY, "--out", str(tmp_path), "--frames-file", str(frames)]
    run = subprocess.run([sys.executable, "bench/gpu.py", *args],
                         cwd=ROOT, capture_output=True, text=True,
                         timeout=120 * TIMEOUT_FACTOR)  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    out = run.stdout
    assert f"JPEGs written to {frames}" in out and frames.stat().st_size > 10_000
    assert re.search(r"in the worker, p50/p99 ms: decode [\d.]+/[\d.]+, queue", out), out
    assert "model yolox_nano_416.onnx (416x416); batch 1" in out
    assert "providers CPUExecutionProvider" in out
    tunnel = re.search(r"tunnel \(end to end\)\s+([\d.]+) frames/s", out)
    bare = re.search(r"bare \(decode \+ infer\)\s+([\d.]+) frames/s", out)
    ratio = re.search(r"ratio tunnel / bare ([\d.]+)", out)
    assert tunnel and bare and ratio, out
    assert float(tunnel[1]) > 0 and float(bare[1]) > 0
    assert re.search(r"latency p50 [\d.]+ ms, p99 [\d.]+ ms", out), out
    results = json.loads((tmp_path / "gpu.json").read_text())
    assert results["providers"] == ["CPUExecutionProvider"]
    assert results["tunnel_fps"] > 0 and results["bare_fps"] > 0 and results["model_fps"] > 0
    assert results["ratio"] == pytest.approx(results["tunnel_fps"] / results["bare_fps"])
    assert results["errors"] == 0 and results["latency_ms"]["p99"] >= results["latency_ms"]["p50"]
    assert set(results["worker_stages_ms"]) >= {"decode", "queue", "infer", "track", "worker"}
    model = (results["model"], results["input"], results["batch"])
    assert model == ("yolox_nano_416.onnx", [416, 416], 1)
    if not _gpu_present():  # never a GPU claim without one
        assert "GPU: no GPU: CPU provider" in out
        assert results["gpu"] is None and results["gpu_note"].startswith("no GPU: CPU provider")
    else:  # a GPU is here but the CPU provider ran: the figures say so
        assert "but the worker ran on CPUExecutionProvider: CPU figures" in out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--seconds", "nan"], "--seconds: nan is outside 1..600"),
        (["--tunnels", "0"], "--tunnels: 0 is outside 1..64"),
        (["--worker-option", "decode_threads=0"], "decode_threads: Input should be greater"),
        (["--detector-option", "no_such=1"], "no_such: Extra inputs are not permitted"),
        (["--frames-file", "/nonexistent/dir/x.npz"], "--frames-file: /nonexistent/dir/x.npz"),
    ],
)
def test_bad_settings_are_one_usage_line(args: list[str], says: str) -> None:
    run = subprocess.run([sys.executable, "bench/gpu.py", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert run.returncode == 2
    assert says in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_the_check_script_parses() -> None:
    run = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    assert os.access(SCRIPT, os.X_OK), "scripts/gpu-check.sh must be executable"


def test_the_dry_run_lists_the_steps_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    venv, cache = tmp_path / "venv", tmp_path / "cache"
    env = {**os.environ, "OUT": str(out), "GPU_CHECK_VENV": str(venv),
           "GPU_CHECK_CACHE": str(cache)}  # fmt: skip
    run = subprocess.run([str(SCRIPT), "--dry-run"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=30)  # fmt: skip
    assert run.returncode == 0, run.stderr
    listed = [line.split()[0] for line in run.stderr.splitlines() if line.startswith("  ")]
    assert listed == list(STEPS), run.stderr
    assert "budget 480 s" in run.stderr
    assert "onnxruntime-gpu==" in run.stderr and "tensorrt-cu12-libs" in run.stderr
    assert not out.exists() and not venv.exists() and not cache.exists()


def test_the_script_takes_its_pins_from_the_cuda_image() -> None:
    dockerfile = (ROOT / "deploy" / "docker" / "worker-cuda.Dockerfile").read_text()
    ort = re.search(r"^ARG ORT_VERSION=(\S+)$", dockerfile, re.M)
    trt = re.search(r'^ARG TENSORRT_SPEC="(.+)"$', dockerfile, re.M)
    assert ort and trt, "the CUDA image's pins moved: update scripts/gpu-check.sh's sed"
    run = subprocess.run([str(SCRIPT), "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                         timeout=30, env={**os.environ, "OUT": "/nonexistent/out"})  # fmt: skip
    assert f"onnxruntime-gpu=={ort[1]}, {trt[1]}" in run.stderr


def test_unknown_arguments_are_refused() -> None:
    run = subprocess.run([str(SCRIPT), "--bogus"], cwd=ROOT, capture_output=True, text=True,
                         timeout=30)  # fmt: skip
    assert run.returncode == 2 and "unknown argument '--bogus'" in run.stderr


def test_stored_frames_read_back_the_same(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from bench.gpu import stored_frames

    path = tmp_path / "frames.npz"
    made, lb = stored_frames(path, 5, (416, 416))
    read, lb2 = stored_frames(path, 5, (416, 416))
    assert read == made and len(read) == 5 and lb2 == lb
    assert stored_frames(path, 2, (416, 416))[0] == made[:2]
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not numpy")
    with pytest.raises(SystemExit, match="not a frames file of bench"):
        stored_frames(junk, 2, (416, 416))


def test_the_profile_runs_on_the_cpu_and_says_what_it_measured(tmp_path: Path) -> None:
    args = ["--providers", "cpu", "--batch", "2", "--runs", "1", "--out", str(tmp_path)]
    run = subprocess.run([sys.executable, "bench/gpu_profile.py", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=120 * TIMEOUT_FACTOR)  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "new thread, batch 2: first run" in run.stdout
    assert re.search(r"one batch, ms: infer [\d.]+, stack [\d.]+, upload", run.stdout)
    results = json.loads((tmp_path / "gpu-profile.json").read_text())
    assert results["providers"] == ["CPUExecutionProvider"]
    assert set(results["breakdown_ms"]) == {"infer", "stack", "upload", "graph_on_device"}
    assert "skipped" in results["nvimgcodec"] or results["nvimgcodec"]
