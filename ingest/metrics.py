"""Prometheus metrics of the ingest streams, read from the streams at scrape time.

A custom collector (no per-frame cost, and a removed stream's series vanish
with it) registered on the ingest's private ``CollectorRegistry``:

* ``framerelay_ingest_stream_state{stream,state}`` - 1 for the current state;
* ``framerelay_ingest_stream_frames_total{stream,reason}`` - every frame
  counter of the stream (``decoded``, ``sampled_out``, ``replaced``,
  ``no_credit``, ``decode_error``, ...; see :mod:`ingest.stream`);
* ``framerelay_ingest_stream_source_events_total{stream,event}`` -
  ``open_error``, ``stall``, ``source_lost``, ``reconnects``;
* ``framerelay_ingest_stream_epoch``, ``..._inflight``, ``..._credits``,
  ``..._last_frame_age_seconds``, ``..._lag_seconds`` (per stream);
* ``framerelay_ingest_tunnel_connected`` and ``..._tunnel_connects_total``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ingest.stream import COUNTERS, StreamState

if TYPE_CHECKING:
    from ingest.service import IngestService

SOURCE_EVENTS = ("open_error", "stall", "source_lost", "reconnects")
"""Counters of the source rather than of frames."""
FRAME_REASONS = tuple(c for c in COUNTERS if c not in SOURCE_EVENTS)


class StreamCollector:
    """Collects the state and counters of every stream of an :class:`IngestService`."""

    def __init__(self, service: IngestService) -> None:
        self._service = service

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        p = "framerelay_ingest_"
        state = GaugeMetricFamily(
            p + "stream_state", "1 for the stream's current state", labels=["stream", "state"]
        )
        frames = CounterMetricFamily(
            p + "stream_frames", "Frames of a stream by outcome or drop reason",
            labels=["stream", "reason"],
        )  # fmt: skip
        events = CounterMetricFamily(
            p + "stream_source_events", "Source failures and reconnects", labels=["stream", "event"]
        )
        gauges = {
            name: GaugeMetricFamily(p + "stream_" + name, doc, labels=["stream"])
            for name, doc in (
                ("epoch", "Current epoch (bumps on every discontinuity)"),
                ("inflight", "Frames sent and not answered yet"),
                ("credits", "Frames allowed in flight"),
                ("last_frame_age_seconds", "Seconds since the last decoded frame"),
                ("lag_seconds", "Live sources: how far decoding is behind the source"),
            )
        }
        now = time.monotonic()
        for sid, stream in list(self._service.streams.items()):
            for s in StreamState:
                state.add_metric([sid, s.value], 1.0 if stream.state is s else 0.0)
            for reason in FRAME_REASONS:
                frames.add_metric([sid, reason], stream.counters[reason])
            for event in SOURCE_EVENTS:
                events.add_metric([sid, event], stream.counters[event])
            gauges["epoch"].add_metric([sid], stream.epoch)
            gauges["inflight"].add_metric([sid], len(stream.window.inflight))
            gauges["credits"].add_metric([sid], stream.window.limit)
            if stream.lag_s is not None:
                gauges["lag_seconds"].add_metric([sid], stream.lag_s)
            if stream.last_frame_at is not None:
                gauges["last_frame_age_seconds"].add_metric([sid], now - stream.last_frame_at)
        yield from (state, frames, events, *gauges.values())
        client = self._service.client
        yield GaugeMetricFamily(
            p + "tunnel_connected", "1 while the tunnel to the worker is up",
            value=1.0 if client.connected.is_set() else 0.0,
        )  # fmt: skip
        yield CounterMetricFamily(
            p + "tunnel_connects", "Tunnel connections made", value=client.connects
        )


def register_stream_metrics(service: IngestService, registry: CollectorRegistry) -> None:
    """Add the stream collector to ``registry`` (the ingest's private one)."""
    registry.register(StreamCollector(service))
