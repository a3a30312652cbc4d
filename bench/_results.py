"""Where benchmarks leave their figures: ``bench/results/<name>.json`` (git-ignored)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_results(name: str, data: object) -> Path:
    """Write ``data`` as indented JSON and say where."""
    out = ROOT / "bench" / "results" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return out
