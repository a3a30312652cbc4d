#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv.
#   scripts/bootstrap.sh            runtime (CPU ONNX Runtime)
#   scripts/bootstrap.sh dev        runtime + test/lint tools
# Re-installs only when pyproject.toml changed since the last run.
set -euo pipefail
cd "$(dirname "$0")/.."

extras="cpu"
[ "${1:-}" = "dev" ] && extras="cpu,dev"
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
  .venv/bin/python -m pip install --quiet -e ".[$extras]"
  echo "$want" > "$stamp"
fi
