#!/usr/bin/env bash
# The GPU check of issue 14: on a bare GPU machine with this repository, install what the
# GPU path needs, run the tests marked `gpu` and bench/gpu.py, and leave the results in
# $OUT (default ./gpu-check-out), all within a budget of 8 minutes. Every step runs under
# `timeout` (capped by what is left of the budget); a step that fails or times out is
# recorded and the next one still runs; summary.txt says what each step did.
#
#   scripts/gpu-check.sh                  install, test, bench (about 8 minutes at most)
#   scripts/gpu-check.sh --dry-run        print the settings and the steps; install, run
#                                         and write nothing
#   scripts/gpu-check.sh --skip-install   use the venv as it is (a second run)
#   scripts/gpu-check.sh --wheels DIR     install offline from a wheelhouse (pip --no-index)
#   scripts/gpu-check.sh --system-site-packages   let the venv see the machine's packages
#
# Environment: OUT (results folder), GPU_CHECK_VENV (.venv-gpu), GPU_CHECK_BUDGET_S (480),
# GPU_CHECK_CACHE (TensorRT engine and timing caches, .cache/trt: a second run skips the
# engine build), PYTHON (python3, >= 3.11), GPU_CHECK_BENCH_ARGS (bench/gpu.py's arguments
# but --fps and --name; default: issue 14's scale, below).
# What it installs: the project with the `gpu` extra, onnxruntime-gpu and the TensorRT
# runtime wheels at the pins of deploy/docker/worker-cuda.Dockerfile, CUDA 12 / cuDNN 9
# runtime wheels (no CUDA toolkit needed, only the driver), pytest and matplotlib.
# $OUT gets 8 files: summary.txt env.txt install.log tests.log bench.log gpu.json gpu.png
# gpu-flat.json (gpu-flat.png stays in bench/results).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
DRY_RUN=false SKIP_INSTALL=false WHEELS="" SYSSITE=""
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY_RUN=true ;;
    --skip-install) SKIP_INSTALL=true ;;
    --wheels)
      [ $# -ge 2 ] && [ -d "$2" ] || { echo "gpu-check: --wheels needs a folder of wheels" >&2; exit 2; }
      WHEELS=$(cd "$2" && pwd); shift ;;
    --system-site-packages) SYSSITE=--system-site-packages ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

BUDGET=${GPU_CHECK_BUDGET_S:-480}
case $BUDGET in ''|*[!0-9]*) echo "gpu-check: GPU_CHECK_BUDGET_S must be whole seconds" >&2; exit 2 ;; esac
RESERVE_S=15  # kept for writing the summary
OUT=${OUT:-$ROOT/gpu-check-out}
VENV=${GPU_CHECK_VENV:-$ROOT/.venv-gpu}
CACHE=${GPU_CHECK_CACHE:-$ROOT/.cache/trt}
PYTHON=${PYTHON:-python3}
DOCKERFILE=deploy/docker/worker-cuda.Dockerfile
ORT_VERSION=$(sed -n 's/^ARG ORT_VERSION=//p' "$DOCKERFILE" | head -n 1)
TENSORRT_SPEC=$(sed -n 's/^ARG TENSORRT_SPEC="\(.*\)"$/\1/p' "$DOCKERFILE" | head -n 1)
ORT_VERSION=${ORT_VERSION:-1.26.0}
TENSORRT_SPEC=${TENSORRT_SPEC:-tensorrt-cu12-libs>=10.9,<11}
CUDA_LIBS="nvidia-cuda-runtime-cu12 nvidia-cublas-cu12 nvidia-cudnn-cu12>=9,<10 nvidia-cufft-cu12 nvidia-curand-cu12"
TEST_TOOLS="pytest>=8 pytest-timeout>=2.3 hypothesis>=6.100 matplotlib>=3.8"
# Issue 14's scale: 8 tunnels x 128 cameras flat out (capacity, the ratio to the bare loop),
# then at 5 fps (5,120 frames/s offered). The engine step builds the same engine first.
BENCH_ARGS=${GPU_CHECK_BENCH_ARGS:-"--providers tensorrt --tunnels 8 --streams 128 --inflight 2 --max-batch 64 --decode-threads 8 --warmup 5 --seconds 10"}
VPY=$VENV/bin/python
export ROOT OUT VENV VPY CACHE PYTHON SYSSITE WHEELS ORT_VERSION TENSORRT_SPEC CUDA_LIBS
export TEST_TOOLS BENCH_ARGS PYTHONUNBUFFERED=1

# -- the steps (each runs as `bash -c NAME` under timeout; STEP_LIMIT is its limit) --------

step_gpu() {
  set -euo pipefail
  nvidia-smi -L
  { echo "== nvidia-smi"; nvidia-smi; echo; echo "== nvidia-smi -q"; nvidia-smi -q; } >>"$OUT/env.txt"
}

step_venv() {
  set -euo pipefail
  [ -x "$VPY" ] || "$PYTHON" -m venv $SYSSITE "$VENV"
  "$VPY" -c 'import sys; assert sys.version_info >= (3, 11), sys.version; print(sys.version)'
}

step_install() {
  set -euo pipefail -f  # -f: the version specs are not globs
  local pip=("$VPY" -m pip install --disable-pip-version-check --progress-bar off)
  if [ -n "$WHEELS" ]; then pip+=(--no-index --find-links "$WHEELS" --no-build-isolation); fi
  # Exactly one ONNX Runtime in the venv: the CPU build installs the same module.
  if "$VPY" -m pip show onnxruntime >/dev/null 2>&1; then
    "$VPY" -m pip uninstall -y onnxruntime || true
  fi
  "${pip[@]}" -e ".[gpu]" "onnxruntime-gpu==$ORT_VERSION" "$TENSORRT_SPEC" $CUDA_LIBS $TEST_TOOLS
}

step_versions() {
  set -uo pipefail
  "$VPY" - "$ROOT/samples/models/yolox_nano_416.onnx" <<'PY'
import importlib.metadata as md
import sys

print("python", sys.version.split()[0])
for name in ("onnxruntime-gpu", "onnxruntime", "tensorrt-cu12-libs", "nvidia-cudnn-cu12",
             "nvidia-ml-py", "nvidia-nvimgcodec-cu12", "numpy", "simplejpeg", "websockets"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} -")
import onnxruntime as ort

print("available providers:", ort.get_available_providers())
if "CUDAExecutionProvider" in ort.get_available_providers():
    try:  # listed is not working: what a session really uses (TensorRT: the engine step)
        wanted = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        session = ort.InferenceSession(sys.argv[1], providers=wanted)
        print("a session asking for CUDA uses", session.get_providers())
    except Exception as exc:
        print(f"a session asking for CUDA failed: {exc}")
PY
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
}

step_engine() {  # the bench's TensorRT engine, built once into the cache (and timed)
  set -uo pipefail
  "$VPY" - "$ROOT/samples/models/yolox_nano_416.onnx" "$ENGINE_OPTIONS" <<'PY'
import json
import sys
import time
from pathlib import Path

import numpy as np

from framerelay.geometry import Letterbox
from gpu_worker.detectors import ModelInput, load_detector, settings_for_model

options = json.loads(sys.argv[2])
started = time.perf_counter()
det = load_detector(settings_for_model(Path(sys.argv[1]), **options))
print(f"session in {time.perf_counter() - started:.1f} s; providers {det.providers}")
prepare = getattr(det, "prepare", None)
if callable(prepare):  # each batch bucket once, as the worker does on its inference thread
    started = time.perf_counter()
    prepare()
    print(f"batch shapes prepared in {time.perf_counter() - started:.1f} s")
w, h = det.input_size
image = ModelInput(np.full((h, w, 3), 114, np.uint8), Letterbox.fit(w, h, w, h))
for n in (1, options["max_batch"]):
    started = time.perf_counter()
    det.infer([image] * n)
    print(f"first batch of {n}: {time.perf_counter() - started:.1f} s")
PY
}

step_tests() {
  set -uo pipefail
  local files
  files=$(grep -rl --include='*.py' -e 'mark\.gpu' tests | sort || true)
  if [ -z "$files" ]; then echo "no test is marked gpu"; return 0; fi
  echo "files with gpu tests:" $files
  # shellcheck disable=SC2086
  # Warnings stay warnings here: another machine's package versions warn in their own
  # ways, and the suite's filterwarnings=error would turn them into failures.
  "$VPY" -m pytest -m gpu -q -rA -p no:cacheprovider -o filterwarnings=default $files
}

step_profile() {  # one batch's breakdown, first runs in a new thread, nvImageCodec backends
  set -uo pipefail
  local providers
  providers=$(echo "$BENCH_ARGS" | sed -n 's/.*--providers \([a-z]*\).*/\1/p')
  "$VPY" bench/gpu_profile.py --providers "${providers:-auto}" --batch 64 --runs 10 \
    $(echo "$BENCH_ARGS" | grep -o -- '--frames-file [^ ]*' || true)
}

bench() {  # NAME FPS: one bench/gpu.py run, its results in bench/results
  set -uo pipefail
  local start=$(( STEP_LIMIT - 60 ))
  [ "$start" -ge 10 ] || start=10
  echo "== bench/gpu.py $BENCH_ARGS --fps $2 --name $1 $DETECTOR_OPTS"
  # shellcheck disable=SC2086
  "$VPY" bench/gpu.py $BENCH_ARGS --fps "$2" --name "$1" --start-timeout "$start" $DETECTOR_OPTS
}
step_bench() { bench gpu 5; }
step_bench_flat() { bench gpu-flat 0; }
export -f step_gpu step_venv step_install step_versions step_engine step_tests step_profile \
  bench step_bench step_bench_flat

# -- the runner -------------------------------------------------------------------------

STARTED=$SECONDS
STEPS=()  # "name|status|seconds|what"
FAILED=0

run_step() {  # NAME LIMIT_S LOG WHAT: run step_NAME, output to the console and $OUT/LOG
  local name=$1 limit=$2 log=$3 what=$4
  local left=$(( BUDGET - (SECONDS - STARTED) - RESERVE_S ))
  [ "$limit" -le "$left" ] || limit=$left
  if $DRY_RUN; then
    printf '  %-11s up to %3s s  %s\n' "$name" "$2" "$what"
    return 0
  fi
  if [ "$limit" -lt 10 ]; then
    STEPS+=("$name|SKIPPED (budget spent)|0|$what"); FAILED=1; return 0
  fi
  echo "== $name (up to $limit s): $what" | tee -a "$OUT/$log" >&2
  local t0=$SECONDS rc
  set +e
  STEP_LIMIT=$limit timeout -k 10 "$limit" bash -c "step_${name//-/_}" 2>&1 | tee -a "$OUT/$log"
  rc=${PIPESTATUS[0]}
  set -e
  local status="ok"
  case $rc in
    0) ;;
    124|137) status="TIMED OUT after $limit s"; FAILED=1 ;;
    *) status="FAILED (exit $rc)"; FAILED=1 ;;
  esac
  STEPS+=("$name|$status|$(( SECONDS - t0 ))|$what")
  echo "== $name: $status in $(( SECONDS - t0 )) s" >&2
}

library_path() {  # the CUDA, cuDNN and TensorRT libraries the wheels brought
  timeout 30 "$VPY" - <<'PY' 2>/dev/null || true
import glob
import os
import site

dirs = []
for base in site.getsitepackages():
    dirs += sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib")))
    dirs += sorted(glob.glob(os.path.join(base, "tensorrt_libs")))
print(":".join(dirs))
PY
}

detector_options() {  # engine cache and FP16 through the detector's settings, where it has them
  timeout 60 "$VPY" - "$CACHE" <<'PY' 2>/dev/null || true
import sys

from gpu_worker.detectors import OnnxDetectorSettings

fields = OnnxDetectorSettings.model_fields
wanted = {"engine_cache_dir": sys.argv[1], "fp16": "true"}
print(" ".join(f"--detector-option {k}={v}" for k, v in wanted.items() if k in fields))
PY
}

engine_options() {  # the bench's detector settings (--providers, --max-batch, the above) as JSON
  timeout 30 "$VPY" - "$BENCH_ARGS $DETECTOR_OPTS" <<'PY' 2>/dev/null || echo '{"max_batch": 8}'
import json
import shlex
import sys

args, out = shlex.split(sys.argv[1]), {"max_batch": 8}
for flag, value in zip(args, args[1:]):
    if flag == "--providers":
        out["providers"] = value
    elif flag == "--max-batch" and int(value) > 0:
        out["max_batch"] = int(value)
    elif flag == "--detector-option":
        key, _, val = value.partition("=")
        out[key] = val
print(json.dumps(out))
PY
}

headline() {  # the figures bench/gpu.py printed
  grep -E '^(== (bench|engine)|session in|batch shapes|first batch|one batch|  new thread|prepare|nvImageCodec|model |engine: |GPU: |[0-9]+ tunnels|  (tunnel|bare|model only|ratio|sent|the senders|first problem))' \
    "$OUT/bench.log" 2>/dev/null || echo "(no bench figures)"
}

SUMMARY_DONE=false
finish() {
  $DRY_RUN && return 0
  $SUMMARY_DONE && return 0
  SUMMARY_DONE=true
  local f gpu
  for f in gpu.json gpu.png gpu-flat.json; do  # only what this run wrote
    if [ "bench/results/$f" -nt "$STAMP" ]; then cp "bench/results/$f" "$OUT/$f"; fi
  done
  rm -f "$STAMP"
  gpu=$(nvidia-smi -L 2>/dev/null | head -n 1 || true)
  {
    echo "scripts/gpu-check.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
    echo "GPU: ${gpu:-none answers nvidia-smi}"
    echo "onnxruntime-gpu==$ORT_VERSION, $TENSORRT_SPEC; budget $BUDGET s, used $(( SECONDS - STARTED )) s"
    echo
    printf '%-11s %-28s %6s  %s\n' step status seconds what
    local row name status took what
    for row in "${STEPS[@]}"; do
      IFS='|' read -r name status took what <<<"$row"
      printf '%-11s %-28s %6s  %s\n' "$name" "$status" "$took" "$what"
    done
    echo
    echo "bench/gpu.py printed (bench.log has everything; gpu.json, gpu-flat.json the figures):"
    headline
  } >"$OUT/summary.txt"
  cat "$OUT/summary.txt" >&2
}

# -- main -------------------------------------------------------------------------------

echo "gpu-check: budget $BUDGET s; OUT=$OUT; venv $VENV; onnxruntime-gpu==$ORT_VERSION," \
  "$TENSORRT_SPEC; engine cache $CACHE${WHEELS:+; wheels from $WHEELS}" >&2
if $DRY_RUN; then
  echo "steps (--dry-run: nothing is installed, run or written; each limit is capped by" \
    "what is left of the $BUDGET s, $RESERVE_S s kept for the summary):" >&2
  exec 1>&2
else
  mkdir -p "$OUT" "$CACHE"
  : >"$OUT/install.log"
  STAMP=$(mktemp)  # results older than this are not this run's
  trap finish EXIT
fi

run_step gpu 20 env.txt "nvidia-smi -L; nvidia-smi -q into env.txt"
if ! $DRY_RUN && [ "${STEPS[0]#gpu|ok}" = "${STEPS[0]}" ]; then
  echo "gpu-check: no GPU answers nvidia-smi: nothing to measure here (the CPU path is" \
    "checked by the test suite and 'bench/gpu.py --providers cpu')" >&2
  exit 1
fi
run_step venv 60 install.log "a venv at $VENV ($PYTHON${SYSSITE:+ $SYSSITE})"
if $SKIP_INSTALL; then
  $DRY_RUN && echo "  install     skipped (--skip-install)"
  $DRY_RUN || STEPS+=("install|skipped (--skip-install)|0|")
else
  run_step install 240 install.log "pip install -e '.[gpu]' onnxruntime-gpu==$ORT_VERSION '$TENSORRT_SPEC' CUDA 12 + cuDNN 9 runtime wheels, pytest, matplotlib"
fi
if ! $DRY_RUN; then
  LIBS=$(library_path)
  export LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  DETECTOR_OPTS=$(detector_options)
  if [ -z "$DETECTOR_OPTS" ]; then  # an older detector: ONNX Runtime's own TensorRT settings
    export ORT_TENSORRT_ENGINE_CACHE_ENABLE=1 ORT_TENSORRT_TIMING_CACHE_ENABLE=1
    export ORT_TENSORRT_CACHE_PATH=$CACHE ORT_TENSORRT_FP16_ENABLE=1
  fi
  ENGINE_OPTIONS=$(engine_options)
  export DETECTOR_OPTS ENGINE_OPTIONS
fi
run_step versions 45 env.txt "versions, available providers, the providers a CUDA session really uses"
run_step engine 150 bench.log "build the bench's TensorRT engine (batch 1 and max) into $CACHE, timed"
run_step tests 90 tests.log "pytest -m gpu on the test files with gpu tests"
run_step profile 60 bench.log "bench/gpu_profile.py: one batch's breakdown, first runs per thread, nvImageCodec"
run_step bench-flat 100 bench.log "bench/gpu.py $BENCH_ARGS --fps 0 (flat out: capacity, ratio to bare)"
run_step bench 100 bench.log "the same, each stream paced at 5 fps"
if $DRY_RUN; then
  echo "  summary     copy bench/results/gpu.json, gpu.png, gpu-flat.json; write summary.txt" >&2
  exit 0
fi
finish
exit "$FAILED"
