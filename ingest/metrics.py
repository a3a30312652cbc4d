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
* ``framerelay_ingest_stream_worker{stream,worker}`` - 1 for the tunnel that
  serves the stream (none while no tunnel does);
* per tunnel (``worker``: ``default`` for ``worker_url``, else the worker id
  the orchestrator placed streams on; every tunnel of the registry):
  ``framerelay_ingest_tunnel_connected{worker}`` (1 while connected),
  ``..._tunnel_connects_total{worker}``,
  ``framerelay_ingest_tunnel_state{worker,state}`` (1 for IDLE,
  CONNECTING, UP, STALLED or DOWN), ``..._tunnel_stalls_total{worker}``,
  ``..._tunnel_last_result_age_seconds{worker}`` (while connected),
  ``..._tunnel_heartbeat_rtt_seconds{worker}`` (p95), ``..._tunnel_errors_total``
  ``{worker}`` (unexpected errors, each followed by a reconnect) and
  ``..._tunnel_stream_crashes_total{worker}`` (streams failed by their sender
  or result handling);
* ``framerelay_ingest_failovers_total`` - streams moved off an unhealthy
  worker, and ``..._moves_total`` - every move between workers (placements
  and failovers).
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
    from ingest.stream import IngestStream
    from ingest.tunnel_client import TunnelClient

SOURCE_EVENTS = (
    "open_error", "stall", "source_lost", "reconnects", "auth_failed", "size_refused",
    "corrupt_timestamps",
)  # fmt: skip
"""Counters of the source rather than of frames."""
FRAME_REASONS = tuple(c for c in COUNTERS if c not in SOURCE_EVENTS)
P = "framerelay_ingest_"
STREAM_GAUGES = (
    ("epoch", "Current epoch (bumps on every discontinuity)"),
    ("inflight", "Frames sent and not answered yet"),
    ("credits", "Frames allowed in flight"),
    ("last_frame_age_seconds", "Seconds since the last decoded frame"),
    ("lag_seconds", "Live sources: how far decoding is behind the source"),
)
TUNNEL_GAUGES = (
    ("connected", "1 while the tunnel to the worker is connected"),
    ("last_result_age_seconds", "Seconds since the last result (connected)"),
    ("heartbeat_rtt_seconds", "p95 round trip (heartbeats and frames)"),
)
TUNNEL_COUNTERS = (
    ("connects", "Tunnel connections made"),
    ("stalls", "Times the tunnel went STALLED"),
    ("errors", "Unexpected errors that ended a session (then reconnected)"),
    ("stream_crashes", "Streams failed by an exception in their sender or results"),
)


class StreamCollector:
    """Collects the state and counters of every stream and tunnel of an
    :class:`IngestService` (its stream registry)."""

    def __init__(self, service: IngestService) -> None:
        self._registry = service.registry

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self._streams()
        yield from self._tunnels()

    def _streams(self) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            P + "stream_state", "1 for the stream's current state", labels=["stream", "state"]
        )
        frames = CounterMetricFamily(
            P + "stream_frames", "Frames of a stream by outcome or drop reason",
            labels=["stream", "reason"],
        )  # fmt: skip
        events = CounterMetricFamily(
            P + "stream_source_events", "Source failures and reconnects", labels=["stream", "event"]
        )
        worker = GaugeMetricFamily(
            P + "stream_worker", "1 for the tunnel serving the stream", labels=["stream", "worker"]
        )
        gauges = {name: GaugeMetricFamily(P + "stream_" + name, doc, labels=["stream"])
                  for name, doc in STREAM_GAUGES}  # fmt: skip
        where = dict(self._registry.where)
        for sid, stream in list(self._registry.streams.items()):
            for s in StreamState:
                state.add_metric([sid, s.value], 1.0 if stream.state is s else 0.0)
            for reason in FRAME_REASONS:
                frames.add_metric([sid, reason], stream.counters[reason])
            for event in SOURCE_EVENTS:
                events.add_metric([sid, event], stream.counters[event])
            if sid in where:
                worker.add_metric([sid, where[sid]], 1.0)
            _stream_gauges(gauges, sid, stream)
        yield from (state, frames, events, worker, *gauges.values())

    def _tunnels(self) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            P + "tunnel_state", "1 for the tunnel's current state", labels=["worker", "state"]
        )
        gauges = {name: GaugeMetricFamily(P + "tunnel_" + name, doc, labels=["worker"])
                  for name, doc in TUNNEL_GAUGES}  # fmt: skip
        counters = {name: CounterMetricFamily(P + "tunnel_" + name, doc, labels=["worker"])
                    for name, doc in TUNNEL_COUNTERS}  # fmt: skip
        for name, client in list(self._registry.clients.items()):
            for s in TunnelState:
                state.add_metric([name, s.value], 1.0 if client.state is s else 0.0)
            counters["connects"].add_metric([name], client.connects)
            counters["stalls"].add_metric([name], client.health.stalls)
            counters["errors"].add_metric([name], client.errors + client.restarts)
            counters["stream_crashes"].add_metric([name], client.task_errors)
            _tunnel_gauges(gauges, name, client)
        yield from (state, *gauges.values(), *counters.values())
        yield CounterMetricFamily(P + "failovers", "Streams moved off an unhealthy worker",
                                  value=self._registry.failovers)  # fmt: skip
        yield CounterMetricFamily(
            P + "moves", "Streams moved between workers", value=self._registry.moves
        )


def _stream_gauges(gauges: dict[str, GaugeMetricFamily], sid: str, stream: IngestStream) -> None:
    gauges["epoch"].add_metric([sid], stream.epoch)
    gauges["inflight"].add_metric([sid], len(stream.window.inflight))
    gauges["credits"].add_metric([sid], stream.window.limit)
    if stream.lag_s is not None:
        gauges["lag_seconds"].add_metric([sid], stream.lag_s)
    if stream.last_frame_at is not None:
        age = time.monotonic() - stream.last_frame_at
        gauges["last_frame_age_seconds"].add_metric([sid], age)


def _tunnel_gauges(gauges: dict[str, GaugeMetricFamily], name: str, client: TunnelClient) -> None:
    gauges["connected"].add_metric([name], 1.0 if client.connected.is_set() else 0.0)
    seen = client.describe()
    age = seen.get("last_result_age_s")
    if isinstance(age, int | float):  # while connected
        gauges["last_result_age_seconds"].add_metric([name], age)
    p95 = client.health.rtt_p95()
    if p95 is not None:
        gauges["heartbeat_rtt_seconds"].add_metric([name], p95)


def register_stream_metrics(service: IngestService, registry: CollectorRegistry) -> None:
    """Add the stream collector to ``registry`` (the ingest's private one)."""
    registry.register(StreamCollector(service))
