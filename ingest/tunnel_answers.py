"""What a stream makes of its worker's answers other than results: an ERROR for one of
its frames, and a refusal of its OPEN.

Worker errors in a row (no result between) show in the stream's ``error`` after
:data:`FAILING_AFTER` (e.g. its inference raises on every frame); a result clears
that. A refused OPEN (:data:`framerelay.protocol.OPEN_REFUSALS`) shows in
``last_error``; a tracker the worker cannot run, or a model it does not know, is a
definition error and fails the stream, as a bad source does.
"""

from __future__ import annotations

import logging

from framerelay import wire
from framerelay.protocol import FrameFailed
from ingest.stream import IngestStream

log = logging.getLogger(__name__)
MAX_REASON = 300
FAILING_AFTER = 3
"""Worker errors in a row (no result between) before the stream's ``error`` says so."""
FAILING = "the worker fails every frame"
DEFINITION_ERRORS = frozenset({"bad_tracker", "unknown_model"})
"""Refusals of an OPEN that no retry cures: the stream's definition is wrong."""


def answered(stream: IngestStream, failing: dict[str, int]) -> None:
    """A result came: the errors in a row are over."""
    if failing.pop(stream.id, 0) >= FAILING_AFTER and (stream.error or "").startswith(FAILING):
        stream.error = None


def frame_failed(stream: IngestStream, event: FrameFailed, failing: dict[str, int]) -> None:
    """The worker answered one of ``stream``'s frames with an ERROR."""
    stream.counters["worker_error"] += 1
    stream.credit.set()
    said = f"worker error {event.code}: {' '.join(event.message.split())}"[:MAX_REASON]
    stream.last_error = said
    fails = failing[stream.id] = failing.get(stream.id, 0) + 1
    if fails >= FAILING_AFTER:  # e.g. its inference raises: say so where it shows
        stream.error = f"{FAILING} ({fails} in a row): {said}"
    log.debug("stream %s frame %d: worker said %s: %s", stream.id, event.seq, event.code,
              event.message)  # fmt: skip


def open_refused(stream: IngestStream, error: wire.Error) -> None:
    """The worker refused ``stream``'s OPEN: it says why; a bad tracker fails it."""
    said = f"the worker refused the stream: {error.code}: {' '.join(error.message.split())}"
    stream.last_error = said[:MAX_REASON]
    stream.credit.set()
    if error.code in DEFINITION_ERRORS:
        stream.fail(stream.last_error)
