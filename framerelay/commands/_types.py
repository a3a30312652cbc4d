"""argparse types shared by the commands."""

from __future__ import annotations

import argparse
import math


def finite_float(text: str) -> float:
    """A finite number: ``nan``, ``inf`` and non-numbers are one argparse error line
    (``float`` takes ``nan``, which later fails far from the option that carried it)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text!r}")
    return value
