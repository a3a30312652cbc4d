#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv.
#   scripts/bootstrap.sh            runtime (CPU ONNX Runtime)
#   scripts/bootstrap.sh dev        runtime + test/lint tools + the ultralytics extra
#                                   (FRAMERELAY_SKIP_ULTRALYTICS=1 leaves it out; its
#                                   tests then skip, saying how to install it)
# Re-installs only when pyproject.toml changed since the last run.
set -euo pipefail
cd "$(dirname "$0")/.."

extras="cpu"
pins=()
if [ "${1:-}" = "dev" ]; then
  extras="cpu,dev"
  if [ "${FRAMERELAY_SKIP_ULTRALYTICS:-}" != "1" ]; then
    extras="cpu,dev,ultralytics"
    # The torch/torchvision pair that works together (without a pin pip takes the
    # newest CUDA build, several GB, and PyPI's torchvision may not match it).
    case "$(uname -m)" in
      aarch64) pins=(torch==2.9.1 torchvision==0.24.1) ;;
      *) pins=(torch==2.14.1 torchvision==0.29.1) ;;
    esac
  fi
fi
PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "framerelay needs Python >= 3.11 (found: $("$PY" --version 2>&1)); set PYTHON=python3.11" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=".venv/.framerelay-$extras"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "installing framerelay[$extras] into .venv ..." >&2
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[$extras]" "${pins[@]}"
  echo "$want" > "$stamp"
fi
