"""Where benchmarks leave their figures: ``bench/results/<name>.json`` (git-ignored)
and, beside it, ``<name>.png``: a plot drawn by the bench's own ``plot`` function
with matplotlib's Agg backend (no display needed). Without matplotlib the JSON
is still written and one line says why there is no plot."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

Plot = Callable[["Figure", dict[str, Any]], None]
"""Draws a bench's figures (the dict written as JSON) on an empty matplotlib Figure."""


def write_results(
    name: str, data: dict[str, Any], plot: Plot | None = None, *, folder: Path = RESULTS
) -> Path:
    """Write ``data`` as indented JSON to ``folder/<name>.json``, and its plot beside it."""
    out = folder / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {_shown(out)}")
    if plot is not None:
        save_plot(out.with_suffix(".png"), plot, data)
    return out


def save_plot(path: Path, plot: Plot, data: dict[str, Any]) -> Path | None:
    """``plot`` drawn into ``path`` (PNG); None, with one line on stderr, without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print(f"no plot {_shown(path)}: matplotlib is not installed "
              "(pip install matplotlib, or the project's dev extra)", file=sys.stderr)  # fmt: skip
        return None
    fig = Figure(figsize=(9, 5), layout="constrained")
    FigureCanvasAgg(fig)
    plot(fig, data)
    fig.savefig(path, dpi=110)
    print(f"wrote {_shown(path)}")
    return path


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
