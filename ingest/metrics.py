"""Prometheus metrics of the ingest streams, read from the streams at scrape time.

A custom collector (no per-frame cost, and a removed stream's series vanish
with it) registered on the ingest's private ``CollectorRegistry``:

* ``framerelay_ingest_stream_state{stream,state}`` - 1 for the current state;
* ``framerelay_ingest_stream_frames_total{stream,reason}`` - every frame
  counter of the stream (``decoded``, ``sampled_out``, ``replaced``,
  ``no_credit``, ``decode_error``, ...; see :mod:`ingest.stream`);
* ``framerelay_ingest_stream_source_events_total{stream,event}`` -
  ``open_error``, ``stall``, ``source_lost``, ``reconnects``, ``auth_failed``,
  ``size_refused``, ``corrupt_timestamps``;
* ``framerelay_ingest_stream_epoch``, ``..._inflight``, ``..._credits``,
  ``..._last_frame_age_seconds``, ``..._lag_seconds`` (per stream);
* ``framerelay_ingest_tunnel_connected`` and ``..._tunnel_connects_total``
  (the default worker's tunnel);
* per tunnel (``worker``: ``default`` for ``worker_url``, else the pool's
  worker id): ``framerelay_ingest_tunnel_state{worker,state}`` (1 for IDLE,
  CONNECTING, UP, STALLED or DOWN), ``..._tunnel_stalls_total{worker}``,
  ``..._tunnel_last_result_age_seconds{worker}`` (while connected),
  ``..._tunnel_heartbeat_rtt_seconds{worker}`` (p95), ``..._tunnel_errors_total``
  ``{worker}`` (unexpected errors, each followed by a reconnect) and
  ``..._tunnel_stream_crashes_total{worker}`` (streams failed by their sender
  or result handling);
* ``framerelay_ingest_failovers_total`` - streams the pool moved off an
  unhealthy worker, and ``..._moves_total`` - every move between workers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ingest.stream import COUNTERS, StreamState
from ingest.tunnel_health import TunnelState

if TYPE_CHECKING:
    from ingest.service import IngestService

SOURCE_EVENTS = (
    "open_error", "stall", "source_lost", "reconnects", "auth_failed", "size_refused",
    "corrupt_timestamps",
)  # fmt: skip
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
        yield from self._tunnels(p)

    def _tunnels(self, p: str) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            p + "tunnel_state", "1 for the tunnel's current state", labels=["worker", "state"]
        )
        counters = {
            name: CounterMetricFamily(p + "tunnel_" + name, doc, labels=["worker"])
            for name, doc in (
                ("stalls", "Times the tunnel went STALLED"),
                ("errors", "Unexpected errors that ended a session (then reconnected)"),
                ("stream_crashes", "Streams failed by an exception in their sender or results"),
            )
        }
        age = GaugeMetricFamily(
            p + "tunnel_last_result_age_seconds", "Seconds since the last result (connected)",
            labels=["worker"],
        )  # fmt: skip
        rtt = GaugeMetricFamily(
            p + "tunnel_heartbeat_rtt_seconds", "p95 round trip (heartbeats and frames)",
            labels=["worker"],
        )  # fmt: skip
        now = time.monotonic()
        for name, client in list(self._service.tunnels.items()):
            for s in TunnelState:
                state.add_metric([name, s.value], 1.0 if client.state is s else 0.0)
            counters["stalls"].add_metric([name], client.health.stalls)
            counters["errors"].add_metric([name], client.errors + client.restarts)
            counters["stream_crashes"].add_metric([name], client.task_errors)
            if client.monitor.live:
                age.add_metric([name], now - client.health.result_at)
            p95 = client.health.rtt_p95()
            if p95 is not None:
                rtt.add_metric([name], p95)
        yield from (state, *counters.values(), age, rtt)
        pool = self._service.pool
        yield CounterMetricFamily(
            p + "failovers", "Streams moved off an unhealthy worker", value=pool.failovers
        )
        yield CounterMetricFamily(p + "moves", "Streams moved between workers", value=pool.moves)


def register_stream_metrics(service: IngestService, registry: CollectorRegistry) -> None:
    """Add the stream collector to ``registry`` (the ingest's private one)."""
    registry.register(StreamCollector(service))
