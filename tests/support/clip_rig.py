"""Recordings for clip tests, made by the real segmenter in-process (no Redis needed)."""

from __future__ import annotations

import threading
from pathlib import Path

from ingest.recording.index import SegmentIndex
from ingest.recording.segmenter import Event, Segmenter, SegmentEvent
from ingest.recording.settings import RecorderSettings


def record_file(
    out: Path, source: Path, stream: str = "cam-1", *, passes: int = 1, segment_s: float = 2.0
) -> SegmentIndex:
    """Record ``source`` into ``out/<stream>`` ``passes`` times, as fast as it reads (each pass
    a new epoch, so passes overlap on the wall clock like an old recorder's re-records)."""
    settings = RecorderSettings(stream_id=stream, source=str(source), out_dir=out,
                                segment_s=segment_s, realtime=False,
                                redis_url="redis://127.0.0.1:1/0")  # fmt: skip
    directory = out / stream
    index = SegmentIndex.load(directory, stream)

    def sink(ev: Event) -> None:
        if isinstance(ev, SegmentEvent):
            index.upsert(ev.info)

    for _ in range(passes):
        segmenter = Segmenter(settings, directory, sink, index.take_epoch)
        segmenter.run(threading.Event())
        assert segmenter.ended and segmenter.last_error is None, segmenter.last_error
    return index
