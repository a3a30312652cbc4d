"""The built wheel works on first contact: installed in a fresh venv outside the
repository, ``framerelay demo`` and a default ``framerelay worker`` run from an
unrelated read-only directory as uid 65534 (``setpriv``), with no access to the
source tree's samples.

The venv (``python -m venv --without-pip``, no system site packages) gets
framerelay only from the wheel; its third-party packages are symbolic links to
the repository .venv's installed distributions, exactly the closure of the
wheel's own Requires-Dist (``[cpu]``), so a dependency that pyproject.toml
forgets is missing there and the run fails, while almost nothing is downloaded
(only a package that the venv's Python alone needs, e.g. async-timeout below
3.11.3) -- ``--system-site-packages`` would hide such a gap. Details in
wheel_env.py.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
import zipfile

from tests.conftest import TIMEOUT_FACTOR
from tests.packaging.wheel_env import InstalledWheel, clean_env, nobody, readonly_dir

MAX_WHEEL_BYTES = 8 << 20
DATA = {
    "framerelay/_data/yolox_nano_416.onnx",
    "framerelay/_data/TUD-Stadtmitte.mp4",
    "framerelay/_data/frame-000001.jpg",
    "ingest/console_assets/console.html",  # the operator console (ingest/console.py)
    "ingest/console_assets/console.js",
    "ingest/console_assets/console.css",
    "ingest/console_assets/console_jobs.js",  # its batch jobs panel
}


def test_wheel_ships_the_samples_and_stays_small(installed_wheel: InstalledWheel) -> None:
    with zipfile.ZipFile(installed_wheel.wheel) as zf:
        names = set(zf.namelist())
    assert DATA <= names
    tops = {n.split("/")[0] for n in names if not n.startswith("framerelay-")}
    assert tops == {"framerelay", "ingest", "gpu_worker", "tracker", "deploy"}
    assert installed_wheel.wheel.stat().st_size < MAX_WHEEL_BYTES


def test_demo_runs_from_the_wheel_as_nobody(installed_wheel: InstalledWheel) -> None:
    cwd = readonly_dir(installed_wheel.venv.parent, "demo")
    proc = subprocess.run(
        nobody(["framerelay", "demo", "--max-frames", "25", "--quiet"]),
        cwd=cwd, env=clean_env(installed_wheel), capture_output=True, text=True,
        timeout=180 * TIMEOUT_FACTOR,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    row = next(line.split() for line in proc.stdout.splitlines() if line.split()[:1] == ["demo-1"])
    assert row[1] == "STOPPED" and int(row[5]) == 25, proc.stdout  # 25 results
    assert "console: http://127.0.0.1:" in proc.stderr  # served from the wheel's assets


def test_default_worker_gets_ready_from_the_wheel_as_nobody(
    installed_wheel: InstalledWheel,
) -> None:
    cwd = readonly_dir(installed_wheel.venv.parent, "worker")
    env = clean_env(installed_wheel, FRAMERELAY_TOKEN_SECRETS="packaging-test-secret-0123456789")
    with subprocess.Popen(
        nobody(["framerelay", "worker", "--port", "0", "--announce"]),
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line, f"the worker exited: {proc.communicate(timeout=30)[1][-2000:]}"
            port = json.loads(line)["url"].rsplit(":", 1)[1].split("/")[0]
            assert _ready(f"http://127.0.0.1:{port}/readyz", 60 * TIMEOUT_FACTOR)
        finally:
            proc.terminate()
            proc.communicate(timeout=30)


def _ready(url: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 (http on loopback)
                if resp.status == 200:
                    return True
        except OSError:
            time.sleep(0.2)
    return False
