#!/usr/bin/env bash
# The project's test command (README, `make test`, and CI's .ci/run).
# Installs what the tests need, starts the services they use, then runs
# lint, type checks and the whole test suite. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages (apt) and the virtual environment (pip) are installed side by side:
# on a fresh machine each takes about a minute, mostly waiting on the network.
scripts/services.sh &
services=$!
scripts/bootstrap.sh dev
wait "$services"
export PATH="$PWD/.venv/bin:$PATH"

# FRAMERELAY_TEST_LINT=0 runs the tests alone (scripts/busy-check.py: lint does not
# depend on the machine's load).
if [ "${FRAMERELAY_TEST_LINT:-1}" != "0" ]; then
  echo "== ruff" >&2
  ruff check .
  ruff format --check .
  echo "== mypy --strict" >&2
  mypy
  echo "== lint-imports (layering, pyproject.toml [tool.importlinter])" >&2
  lint-imports
fi
echo "== pytest" >&2
DURATIONS=()
if [ "${CI:-}" = "true" ]; then
  export FRAMERELAY_TIMEOUT_FACTOR=${FRAMERELAY_TIMEOUT_FACTOR:-2}
  DURATIONS=(--durations=25)  # the suite must stay under 15 minutes: show where it goes
fi
# One phase, on FRAMERELAY_TEST_WORKERS pytest-xdist workers (4 on CI's 2 cores: most
# tests wait on real-time streams and processes). Every verdict holds on a busy machine
# (timing figures are benchmarks', under bench/), so the slow scenarios run beside the
# rest: the modules holding them are collected first (tests/conftest.py) and
# `--dist loadgroup` hands out one test at a time, so they start at once instead of
# ending the run alone; a module whose tests share one rig is one `xdist_group` (the
# fault matrix). Extra args go to pytest; selecting no test (exit 5) is not a failure.
status=0
python -m pytest -n "${FRAMERELAY_TEST_WORKERS:-4}" --dist loadgroup "${DURATIONS[@]}" "$@" \
  || { rc=$?; [ "$rc" -eq 5 ] || status=$rc; }
exit "$status"
