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

from framerelay.errors import ConfigError

DATA_DIR = Path(__file__).resolve().parent / "_data"
DEFAULT_MODEL = DATA_DIR / "yolox_nano_416.onnx"
"""YOLOX-Nano (COCO, 416x416, Apache-2.0): the default detector of every worker."""
DEFAULT_CLIP = DATA_DIR / "TUD-Stadtmitte.mp4"
"""MOT15 TUD-Stadtmitte (640x480, 25 fps, 179 frames): the demo's default source."""
CANARY_STILL = DATA_DIR / "frame-000001.jpg"
"""The first frame of the sample clip (several people): the orchestrator's canary."""

_WHAT = {
    DEFAULT_MODEL: ("the sample model", "--model FILE"),
    DEFAULT_CLIP: ("the sample clip", "--source FILE_OR_URL"),
    CANARY_STILL: ("the canary still", "a framerelay wheel with its package data"),
}


def bundled(path: Path) -> Path:
    """``path`` if that bundled file is present, else a ConfigError that says what to do.

    The data goes missing only when framerelay was installed without its
    package data (a hand-made copy of the code, a stripped image).
    """
    if path.is_file():
        return path
    what, instead = _WHAT.get(path, ("the bundled file", "another file"))
    raise ConfigError(
        f"{what} is not installed at {path}: reinstall framerelay from its wheel "
        f"(the data ships in it) or use {instead}"
    )
