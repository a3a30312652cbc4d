"""Capped exponential backoff with jitter: the one retry delay of every service.

A :class:`Backoff` counts the failures in a row: each :meth:`Backoff.next_delay`
returns ``initial_s * factor ** attempt`` (at most ``max_s``) times a random
factor in ``[1 - jitter, 1 + jitter]``, never above ``max_s``, and moves on;
:meth:`Backoff.reset` starts over after a success. :meth:`Backoff.delay` is
the same curve without jitter or state, for callers that keep the failure
count elsewhere (the orchestrator keeps it in Redis).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

MAX_EXPONENT = 64
"""Exponents above this are clamped (the delay is long at the cap by then)."""


@dataclass(slots=True)
class Backoff:
    """Capped exponential backoff with +/- ``jitter`` (a fraction of the delay)."""

    initial_s: float = 0.5
    max_s: float = 10.0
    factor: float = 2.0
    jitter: float = 0.2
    attempt: int = 0
    """Failures so far (the exponent of the next delay)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.initial_s) and math.isfinite(self.max_s)):
            raise ValueError(f"delays must be finite, got {self.initial_s}, {self.max_s}")
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError(f"need 0 < initial_s <= max_s, got {self.initial_s}, {self.max_s}")
        if not (math.isfinite(self.factor) and self.factor >= 1):
            raise ValueError(f"factor must be a finite number >= 1, got {self.factor}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")

    def delay(self, attempt: int) -> float:
        """The delay before jitter after ``attempt`` earlier failures (0: the first delay)."""
        exponent = min(max(attempt, 0), MAX_EXPONENT)
        return min(self.max_s, self.initial_s * self.factor**exponent)

    def peek(self) -> float:
        """The delay (before jitter) the next failure will wait."""
        return self.delay(self.attempt)

    def jittered(self, delay_s: float, rng: random.Random | None = None) -> float:
        """``delay_s`` times a random factor in ``[1 - jitter, 1 + jitter]``."""
        spread = (rng or _RNG).uniform(1 - self.jitter, 1 + self.jitter)
        return delay_s * spread

    def next_delay(self, rng: random.Random | None = None) -> float:
        """The next wait (jittered, at most ``max_s``); counts one more failure."""
        delay = self.jittered(self.peek(), rng)
        self.attempt += 1
        return min(delay, self.max_s)

    def reset(self) -> None:
        """Start over at ``initial_s`` (after a success)."""
        self.attempt = 0


_RNG = random.Random()  # noqa: S311 - jitter, not crypto
