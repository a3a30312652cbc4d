"""Waiting for a condition: the tests' one polling helper, in a sync and an async form.

A wait is bounded by ``timeout_s`` x TIMEOUT_FACTOR (slow machines) and ends in a
TimeoutError that names what it waited for. Prefer it to a fixed ``sleep``: a test
waits for what it needs, as long as a loaded machine needs, and no longer.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

from tests.conftest import TIMEOUT_FACTOR

T = TypeVar("T")
EVERY_S = 0.05
"""How often a condition is checked, unless the caller says (a costly check: less often)."""

What = str | Callable[[], str]
"""What a wait is for, in its TimeoutError; a callable is asked at the end (the state
the condition last saw)."""


class _Deadline:
    def __init__(self, timeout_s: float, what: What) -> None:
        self.limit_s = timeout_s * TIMEOUT_FACTOR
        self.at = time.monotonic() + self.limit_s
        self.what = what

    def check(self) -> None:
        """Raise the TimeoutError once the deadline has passed."""
        if time.monotonic() > self.at:
            said = self.what if isinstance(self.what, str) else self.what()
            raise TimeoutError(f"{said}: not within {self.limit_s:.1f} s")


def wait_until(
    cond: Callable[[], T | None], timeout_s: float, what: What, *, every_s: float = EVERY_S
) -> T:
    """Check ``cond`` every ``every_s`` until it returns something true, and return that."""
    deadline = _Deadline(timeout_s, what)
    while True:
        got = cond()
        if got:
            return got
        deadline.check()
        time.sleep(every_s)


@overload
async def wait_until_async(
    cond: Callable[[], Awaitable[T | None]], timeout_s: float, what: What, *, every_s: float = ...
) -> T: ...


@overload
async def wait_until_async(
    cond: Callable[[], T | None], timeout_s: float, what: What, *, every_s: float = ...
) -> T: ...


async def wait_until_async(
    cond: Callable[[], object], timeout_s: float, what: What, *, every_s: float = EVERY_S
) -> object:
    """:func:`wait_until` on the event loop: ``cond`` may be a coroutine function."""
    deadline = _Deadline(timeout_s, what)
    while True:
        got = cond()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got
        deadline.check()
        await asyncio.sleep(every_s)
