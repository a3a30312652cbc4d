"""Fault injection for the fault-test suite. TEST-ONLY: never set in production.

The setting ``test_fault`` (``FRAMERELAY_WORKER_TEST_FAULT``) names one fault; the
settings refuse it unless ``test_hooks`` (``FRAMERELAY_WORKER_TEST_HOOKS=true``)
is on, so no stray variable in a pod's environment can arm it:

* ``hang_inference_after:N`` - the batcher runs N inferences normally, then
  every later one blocks in the inference thread (until the worker stops),
  while ``/healthz`` keeps answering. The worker's watchdog turns ``/readyz``
  503 after ``inference_stall_s``; the orchestrator's canary catches it too
  ("inference hung while the process looks alive") and replaces the worker.
* ``raise_inference_after:N`` - after N inferences every later one raises
  ``RuntimeError`` (as ``detector.infer`` would): that batch fails, the loop
  goes on.
* ``raise_track_after:N`` - after N tracked frames every later tracker update
  raises ``RuntimeError``: that frame fails and its stream's tracker is reset.

Unset (the default) this module does nothing.
"""

from __future__ import annotations

import logging
import threading

from framerelay.errors import ConfigError

log = logging.getLogger(__name__)
ENV = "FRAMERELAY_WORKER_TEST_FAULT"
FAULTS = ("hang_inference_after", "raise_inference_after", "raise_track_after")


def parse_fault(spec: str | None) -> tuple[str, int] | None:
    """(fault name, N) of ``spec``; None when unset. ConfigError for anything unknown."""
    if not spec:
        return None
    name, _, arg = spec.partition(":")
    if name not in FAULTS or not (arg.isascii() and arg.isdigit()) or len(arg) > 9:
        raise ConfigError(
            f"{ENV}={spec!r} is not a known fault; use one of "
            + ", ".join(f"{f}:N" for f in FAULTS)
        )
    return name, int(arg)


class InjectedFault(RuntimeError):
    """What the ``raise_*`` faults raise."""


class FaultInjector:
    """Called from the inference thread: before each inference and each tracker update."""

    def __init__(self, spec: str | None) -> None:
        self.name: str | None = None
        self.after = 0
        self._infers = 0
        self._tracks = 0
        self._release = threading.Event()  # set only at shutdown: a hang ends then
        parsed = parse_fault(spec)
        if parsed is None:
            return
        self.name, self.after = parsed
        log.warning("TEST FAULT ARMED: %s after %d", self.name, self.after)

    def before_infer(self) -> None:
        """Hang or raise once ``after`` inferences ran (per the armed fault)."""
        if self.name not in ("hang_inference_after", "raise_inference_after"):
            return
        self._infers += 1
        if self._infers <= self.after:
            return
        if self.name == "raise_inference_after":
            raise InjectedFault(f"test fault: inference raises after {self.after}")
        self._release.wait()

    def before_track(self) -> None:
        if self.name != "raise_track_after":
            return
        self._tracks += 1
        if self._tracks > self.after:
            raise InjectedFault(f"test fault: tracker update raises after {self.after}")

    def release(self) -> None:
        """End a hang (worker shutdown, or a test that lets the stalled batch finish)."""
        self._release.set()
