"""``tracker`` is pure: importing and using it needs neither onnxruntime nor cv2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CODE = """
import sys
BLOCKED = ("onnxruntime", "cv2", "av", "motmetrics", "trackeval", "trackers", "supervision",
           "gpu_worker")
for name in BLOCKED:
    sys.modules[name] = None  # any import of these now raises ImportError
import numpy as np
import tracker
import tracker.eval  # the eval tool imports its heavy dependencies lazily
from framerelay.detections import Detections
for name in tracker.available_trackers():
    trk = tracker.create_tracker(name)
    d = Detections(np.array([[0, 0, 10, 20]], np.float32), np.array([0.9], np.float32),
                   np.array([0], np.int32))
    trk.update(d, 0.0)
    tracker.restore_tracker(trk.snapshot())
loaded = sorted(n for n in BLOCKED if sys.modules.get(n) is not None)
assert not loaded, loaded
print("ok")
"""


def test_tracker_imports_without_onnxruntime_or_cv2() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CODE], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
