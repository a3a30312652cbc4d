"""The frames a stream sent, kept while someone watches it (the console's live view).

The live view draws each result on the very frame it belongs to. The ingest
already holds that frame: the letterboxed JPEG it sent to the worker
(:class:`ingest.prepare.Prepared`). While a viewer is attached, the stream's
sender remembers the last :data:`KEPT` of them (references, not copies) by
``(epoch, seq)``, the key every result carries; the viewer takes the one its
result names. Nothing is kept, and the sender does one attribute test per
frame, while nobody watches.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass

from ingest.prepare import Prepared

KEPT = 32
"""Frames kept per watched stream: more than the worker's in-flight window (default 4)
plus the results still queued for a slow viewer."""


@dataclass(frozen=True, slots=True)
class SentFrame:
    epoch: int
    seq: int
    pts: int
    prepared: Prepared


class SentFrames:
    """The last :data:`KEPT` frames one stream sent, while it has viewers."""

    def __init__(self, size: int = KEPT) -> None:
        self._frames: collections.OrderedDict[tuple[int, int], SentFrame] = (
            collections.OrderedDict()
        )
        self._size = size
        self._lock = threading.Lock()
        self.viewers = 0

    def remember(self, frame: SentFrame) -> None:
        with self._lock:
            self._frames[(frame.epoch, frame.seq)] = frame
            while len(self._frames) > self._size:
                self._frames.popitem(last=False)

    def take(self, epoch: int, seq: int) -> SentFrame | None:
        """The frame ``(epoch, seq)`` and forget it (and every older one): a result comes
        once; None when it is not held (sent before the viewer came, or pushed out)."""
        with self._lock:
            frame = self._frames.pop((epoch, seq), None)
            if frame is not None:
                while self._frames:
                    key = next(iter(self._frames))
                    if key >= (epoch, seq):
                        break
                    del self._frames[key]
            return frame

    def __len__(self) -> int:
        return len(self._frames)
