"""How long a camera file takes to load, against its format's bare parser.

    python bench/config_load.py [--cameras 500] [--repeat 7]

Writes a camera file of ``--cameras`` cameras (``bench/rig/camera_files.py``: each
with its URL, fps, transport, timeout and an FFmpeg option; defaults with a password
from the environment) in YAML, TOML and JSON, and times, alternately, in this process:

* **load**: ``ingest.config_file.load_streams`` (what ``framerelay ingest --config``
  does: read, parse, defaults, password from the environment, every stream validated
  as ``POST /v1/streams`` validates it, ids unique);
* **parse**: the format's parser alone on the same text (PyYAML's LibYAML safe loader,
  ``tomllib``, ``json``): the baseline;
* **load x2**: ``load_streams`` on twice the cameras: how the time grows.

Prints the median wall-clock time of each, the ratio load/parse, load x2 / load
(about 2 when loading grows linearly) and the target: 500 cameras in under a second
(issue 16). The test suite checks only the growth, on CPU time
(``tests/ingest/test_config_file.py``). Writes ``bench/results/config_load.json`` and
``config_load.png``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import write_results  # noqa: E402
from bench.rig.camera_files import FORMATS, PASSWORD_ENV, camera_file  # noqa: E402

TARGET_S = 1.0
"""500 cameras load in under a second."""
TARGET_CAMERAS = 500


def _parser(fmt: str) -> Callable[[str], object]:
    if fmt == "toml":
        return tomllib.loads
    if fmt == "json":
        return json.loads
    import yaml  # type: ignore[import-untyped]

    loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return lambda text: yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader


def measure(fmt: str, cameras: int, repeat: int, folder: Path) -> dict[str, float]:
    """Median seconds of each case (see the module), the cases alternating."""
    from ingest.config_file import load_streams

    env = {PASSWORD_ENV: "bench-password"}
    files = {n: folder / f"cameras-{n}.{fmt}" for n in (cameras, 2 * cameras)}
    for n, path in files.items():
        path.write_text(camera_file(fmt, n))
    text, parse = files[cameras].read_text(), _parser(fmt)
    cases: dict[str, Callable[[], object]] = {
        "load_s": lambda: load_streams(files[cameras], env),
        "parse_s": lambda: parse(text),
        "load_x2_s": lambda: load_streams(files[2 * cameras], env),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, run in cases.items():
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cameras", type=int, default=TARGET_CAMERAS, help="cameras (1-20000)")
    ap.add_argument("--repeat", type=int, default=7, help="loads timed per case (1-100)")
    args = ap.parse_args()
    if not 1 <= args.cameras <= 20_000:
        ap.error("--cameras must be 1-20000")
    if not 1 <= args.repeat <= 100:
        ap.error("--repeat must be 1-100")
    target_s = TARGET_S * args.cameras / TARGET_CAMERAS
    results: dict[str, Any] = {"args": vars(args), "target_s": target_s, "formats": {}}
    with tempfile.TemporaryDirectory(prefix="config-load-") as tmp:
        for fmt in FORMATS:
            got = measure(fmt, args.cameras, args.repeat, Path(tmp))
            got["load_to_parse"] = got["load_s"] / got["parse_s"]
            got["growth_x2"] = got["load_x2_s"] / got["load_s"]
            results["formats"][fmt] = got
            verdict = "within" if got["load_s"] < target_s else "OVER"
            print(
                f"{fmt.upper():4} {args.cameras} cameras, median of {args.repeat}: load "
                f"{got['load_s'] * 1000:.0f} ms ({verdict} the {target_s:g} s target), bare "
                f"parser {got['parse_s'] * 1000:.0f} ms: ratio {got['load_to_parse']:.1f}; "
                f"twice the cameras x{got['growth_x2']:.2f}"
            )
    write_results("config_load", results, plot)
    return 0


def plot(fig: Figure, results: dict[str, Any]) -> None:
    """Median load and bare-parse time per format, with the target."""
    ax = fig.subplots()
    formats = list(results["formats"])
    xs = range(len(formats))
    for offset, key, label in ((-0.2, "load_s", "load_streams"), (0.2, "parse_s", "parser")):
        ms = [results["formats"][f][key] * 1000 for f in formats]
        bars = ax.bar([x + offset for x in xs], ms, width=0.4, label=label)
        ax.bar_label(bars, fmt="%.0f ms")
    ax.axhline(results["target_s"] * 1000, color="tab:red", linestyle="--", label="target")
    ax.set_xticks(list(xs), [f.upper() for f in formats])
    cameras = results["args"]["cameras"]
    ax.set(ylabel="median wall-clock time (ms)", title=f"a camera file of {cameras} cameras")
    ax.legend()


if __name__ == "__main__":
    raise SystemExit(main())
