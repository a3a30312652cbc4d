"""Keep a source running: sessions one after another, with backoff between failures.

:class:`SourceRunner` runs in the stream's decode thread. It opens a session
(:meth:`ingest.source.AVSource.session`); when one fails on a network source
(refused, stalled, lost, live end-of-file) it waits a capped exponential
backoff with jitter (:class:`framerelay.backoff.Backoff`) and opens another, for
ever by default (``max_retries``).
The backoff goes back to its first delay only after a session stayed healthy
(decoding) for ``healthy_after_s``, so a camera that accepts connections and
drops them at once is not hammered. A local file that fails is not retried,
nor a source refused for what it is (:class:`ingest.source.SourceRefused`:
its size); a camera that refuses the credentials
(:class:`ingest.source.SourceAuthFailed`) is retried every ``auth_retry_s``
instead of at the backoff rate. A looping file starts over at once at its end.
After every session the source releases its memory (the failure's traceback,
which holds the decoder, is dropped first).

What happens to the frames, the state and the counters is the caller's
business, through :class:`RunnerHooks`.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Protocol

from framerelay.backoff import Backoff as Backoff  # re-exported for older importers
from framerelay.errors import SourceError
from ingest.source import AVSource, Decoded, Opened, SourceAuthFailed, SourceRefused


def detached(exc: SourceError) -> SourceError:
    """``exc`` without its traceback and context, which hold the decoder's frames (memory)."""
    exc.__traceback__ = None
    exc.__context__ = None
    exc.__cause__ = None
    return exc


class RunnerHooks(Protocol):
    def on_open(self, opened: Opened) -> None:
        """A session opened (the first, a reconnect or a loop)."""

    def on_frame(self, decoded: Decoded) -> bool:
        """A decoded frame; return False to stop."""

    def on_retry(self, error: SourceError, delay_s: float) -> None:
        """A session failed; the next attempt starts in ``delay_s``."""


class SourceRunner:
    """Runs sessions of one source until stopped, ended, or given up (blocking)."""

    def __init__(
        self,
        source: AVSource,
        hooks: RunnerHooks,
        stop: threading.Event,
        *,
        backoff: Backoff,
        healthy_after_s: float = 30.0,
        max_retries: int | None = None,
        auth_retry_s: float = 300.0,
        rng: random.Random | None = None,
    ) -> None:
        self.source = source
        self.hooks = hooks
        self.stop = stop
        self.backoff = backoff
        self.healthy_after_s = healthy_after_s
        self.max_retries = max_retries
        self.auth_retry_s = auth_retry_s
        self.failures = 0
        """Failed attempts since the last session that decoded a frame."""
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not crypto
        self._first_frame_at: float | None = None
        self._stopped_by_hook = False

    def run(self) -> None:
        """Return when stopped or at the end; raise SourceError when giving up."""
        while not self.stop.is_set():
            self._first_frame_at = None
            failure = self._attempt()
            if failure is not None:
                self._failed(failure)
                continue
            if self._stopped_by_hook or not self.source.spec.loop:
                return

    def _attempt(self) -> SourceError | None:
        """One session; its failure (detached from the decoder's frames), if any."""
        failure: SourceError | None = None
        try:
            self.source.session(self.stop, self.hooks.on_open, self._on_frame)
        except SourceError as exc:
            failure = detached(exc)
        self.source.release()
        return failure

    def _on_frame(self, decoded: Decoded) -> bool:
        if self._first_frame_at is None:
            self._first_frame_at = time.monotonic()
            self.failures = 0
        keep = self.hooks.on_frame(decoded)
        self._stopped_by_hook = not keep
        return keep

    def _failed(self, exc: SourceError) -> None:
        if self.stop.is_set():
            return
        if not self.source.spec.network or isinstance(exc, SourceRefused):
            raise exc
        first = self._first_frame_at
        if first is not None and time.monotonic() - first >= self.healthy_after_s:
            self.backoff.reset()
        self.failures += 1
        if self.max_retries is not None and self.failures > self.max_retries:
            raise SourceError(
                f"gave up after {self.failures} failed attempts in a row "
                f"(max_retries={self.max_retries}): {exc}"
            ) from exc
        if isinstance(exc, SourceAuthFailed):
            delay = self.auth_retry_s  # not the backoff: a camera may lock the account
        else:
            delay = self.backoff.next_delay(self._rng)
        self.hooks.on_retry(exc, delay)
        self.stop.wait(delay)
