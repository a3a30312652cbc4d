"""Sample result records: the published shape, with made-up but plausible values."""

from __future__ import annotations

from framerelay.results import DetectionOut, ResultRecord


def result_record(stream: str, seq: int, detections: int = 7) -> ResultRecord:
    """A published-shape result: frame ``seq`` of ``stream`` at 25 fps, with detections."""
    dets = [
        DetectionOut(box=(1.0 + i, 2.0, 30.5, 40.25), confidence=0.5 + i / 100, class_id=i,
                     class_name="person", tracker_id=i + 1)
        for i in range(detections)
    ]  # fmt: skip
    return ResultRecord(
        stream_id=stream, epoch=0, seq=seq, pts=seq * 3600, time_base=(1, 90_000),
        pts_time=seq * 0.04, captured_at=1_800_000_000.0 + seq * 0.04,
        received_at=1_800_000_000.05 + seq * 0.04, latency_ms=50.0, worker_id="w",
        detections=dets, timings={"infer_ms": 9.5, "queue_ms": 0.25},
    )  # fmt: skip
