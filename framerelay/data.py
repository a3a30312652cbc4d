"""Where the bundled sample data lies: the detector model, the sample clip, the canary still.

The three files ship inside the ``framerelay`` package (``framerelay/_data``,
package data of the wheel, 5.6 MB), so ``framerelay demo``, a default
``framerelay worker`` and the orchestrator's canary find them wherever the
wheel is installed, from any working directory. In a source checkout
``framerelay/_data`` holds links to the originals under ``samples/``.

Nothing here reads the environment or the working directory: paths come from
this module's own location only.
"""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "_data"
DEFAULT_MODEL = DATA_DIR / "yolox_nano_416.onnx"
"""YOLOX-Nano (COCO, 416x416, Apache-2.0): the default detector of every worker."""
DEFAULT_CLIP = DATA_DIR / "TUD-Stadtmitte.mp4"
"""MOT15 TUD-Stadtmitte (640x480, 25 fps, 179 frames): the demo's default source."""
CANARY_STILL = DATA_DIR / "frame-000001.jpg"
"""The first frame of the sample clip (several people): the orchestrator's canary."""
