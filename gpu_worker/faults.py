"""Fault injection for the fault-test suite. TEST-ONLY: never set in production.

The setting ``test_fault`` (``FRAMERELAY_WORKER_TEST_FAULT``) names one fault; the
settings refuse it unless ``test_hooks`` (``FRAMERELAY_WORKER_TEST_HOOKS=true``)
is on, so no stray variable in a pod's environment can arm it:

* ``hang_inference_after:N`` - the batcher processes N batches normally, then
  every later batch blocks forever in the inference thread, while ``/healthz``
  and ``/readyz`` keep answering. The orchestrator's canary must catch this
  ("inference hung while the process looks alive") and replace the worker.

Unset (the default) this module does nothing.
"""

from __future__ import annotations

import logging
import threading

from framerelay.errors import ConfigError

log = logging.getLogger(__name__)
ENV = "FRAMERELAY_WORKER_TEST_FAULT"


class FaultInjector:
    """Called once per batch from ``Batcher.process`` (the inference thread)."""

    def __init__(self, spec: str | None) -> None:
        self.hang_after: int | None = None
        self._batches = 0
        self._never = threading.Event()  # never set: hanging means waiting on it
        if not spec:
            return
        name, _, arg = spec.partition(":")
        if name != "hang_inference_after" or not arg.isdigit():
            raise ConfigError(
                f"{ENV}={spec!r} is not a known fault; the only one is hang_inference_after:N"
            )
        self.hang_after = int(arg)
        log.warning("TEST FAULT ARMED: inference hangs after %d batches", self.hang_after)

    def before_batch(self) -> None:
        if self.hang_after is None:
            return
        self._batches += 1
        if self._batches > self.hang_after:
            self._never.wait()
