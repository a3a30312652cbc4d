"""Prometheus metrics of the ingest streams, read from the streams at scrape time.

A custom collector (no per-frame cost, and a removed stream's series vanish
with it) registered on the ingest's private ``CollectorRegistry``. Each
labelled counter splits one quantity into disjoint parts, so a ``sum()`` over
a label never counts a thing twice:

* ``framerelay_ingest_stream_state{stream,state}`` - 1 for the current state;
* ``framerelay_ingest_stream_frames_decoded_total{stream}``, ``..._prepared_total``
  (letterboxed and encoded), ``..._sent_total`` - the stages a frame passes;
* ``framerelay_ingest_stream_frames_total{stream,outcome}`` - what became of
  the decoded frames: ``result`` (a result came back) or ``dropped`` (on the
  ingest or lost in flight); frames still in flight are in neither;
* ``framerelay_ingest_stream_frames_dropped_total{stream,reason}`` - the
  ``dropped`` outcome by reason: ``no_pts``, ``out_of_range``,
  ``sampled_out``, ``no_credit``, ``encode_error``, ``replaced`` (ingest),
  ``disconnected``, ``timeout``, ``worker_error`` (in flight);
* ``framerelay_ingest_stream_frames_corrupt_total{stream}`` - decoded frames
  flagged as damaged (kept);
* ``framerelay_ingest_stream_packets_dropped_total{stream,reason}`` - packets
  never decoded: ``decode_error``, ``behind``;
* ``framerelay_ingest_stream_source_failures_total{stream,reason}`` -
  ``open_error``, ``stall``, ``source_lost``, ``auth_failed`` (each followed
  by a reconnect), ``size_refused`` (the stream fails);
  ``..._stream_reconnects_total{stream}`` and
  ``..._stream_corrupt_timestamps_total{stream}`` (discontinuities over the
  epoch budget);
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
* sharded ingests (:mod:`ingest.shards`): ``framerelay_ingest_shard_stream_epoch``
  ``{stream,replica}`` (the lease epoch of each stream this replica runs),
  ``..._shard_live_replicas``, ``..._shard_takeovers_total`` and
  ``..._shard_lost_leases_total``;
* end-to-end latency per stream (:mod:`ingest.latency`): the histogram
  ``framerelay_ingest_result_latency_seconds{stream}`` (10 ms .. 30 s; from
  capture where the source says when, else from decode),
  ``framerelay_ingest_stream_latency_from{stream,clock}`` (1 for the clock
  the last result was measured from: ``capture`` or ``decode``),
  ``framerelay_ingest_latency_slo_seconds{stream}`` (streams with
  ``latency_slo_ms``) and ``framerelay_ingest_slo_breaches_total{stream}``
  (results later than it);
* ``framerelay_ingest_failovers_total`` - streams moved off an unhealthy
  worker, and ``..._moves_total`` - every move between workers (placements
  and failovers).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from ingest.latency import LatencyFrom
from ingest.shards import ShardCollector
from ingest.stream import StreamState
from ingest.tunnel_health import TunnelState

if TYPE_CHECKING:
    from ingest.service import IngestService
    from ingest.stream import IngestStream
    from ingest.tunnel_client import TunnelClient

STAGES = ("decoded", "prepared", "sent")
"""Counters of the stages a frame passes (each its own metric)."""
INGEST_DROPS = ("no_pts", "out_of_range", "sampled_out", "no_credit", "encode_error", "replaced")
"""Frames dropped on the ingest, before sending."""
FLIGHT_DROPS = ("disconnected", "timeout", "worker_error")
"""Frames sent and lost in flight (no result)."""
DROP_REASONS = INGEST_DROPS + FLIGHT_DROPS
PACKET_DROPS = ("decode_error", "behind")
"""Packets never decoded."""
SOURCE_FAILURES = ("open_error", "stall", "source_lost", "auth_failed", "size_refused")
"""Failures of the source (disjoint: one per failed attempt)."""
SINGLE_COUNTERS = (
    ("frames_corrupt", "corrupt", "Decoded frames flagged as damaged (kept)"),
    ("reconnects", "reconnects", "Attempts to open the source again after a failure"),
    ("corrupt_timestamps", "corrupt_timestamps",
     "PTS discontinuities over max_epochs_per_min (not new epochs)"),
)  # fmt: skip
"""``(metric suffix, stream counter, help)`` of the unlabelled per-stream counters."""
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
        worker = GaugeMetricFamily(
            P + "stream_worker", "1 for the tunnel serving the stream", labels=["stream", "worker"]
        )
        gauges = {name: GaugeMetricFamily(P + "stream_" + name, doc, labels=["stream"])
                  for name, doc in STREAM_GAUGES}  # fmt: skip
        counters, latency = _StreamCounters(), _LatencyFamilies()
        where = dict(self._registry.where)
        for sid, stream in list(self._registry.streams.items()):
            for s in StreamState:
                state.add_metric([sid, s.value], 1.0 if stream.state is s else 0.0)
            if sid in where:
                worker.add_metric([sid, where[sid]], 1.0)
            counters.add(sid, dict(stream.counters))  # one snapshot: the parts add up
            _stream_gauges(gauges, sid, stream)
            latency.add(sid, stream)
        yield from (state, worker, *gauges.values(), *counters.families(), *latency.families())

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


class _StreamCounters:
    """The per-stream counter families, filled stream by stream."""

    def __init__(self) -> None:
        def counter(name: str, doc: str, *labels: str) -> CounterMetricFamily:
            return CounterMetricFamily(P + "stream_" + name, doc, labels=["stream", *labels])

        self.stages = {s: counter(f"frames_{s}", f"Frames {s}") for s in STAGES}
        self.outcome = counter(
            "frames", "Decoded frames by outcome: result, or dropped (ingest or in flight)",
            "outcome",
        )  # fmt: skip
        self.dropped = counter("frames_dropped", "Dropped frames by reason", "reason")
        self.packets = counter("packets_dropped", "Packets never decoded, by reason", "reason")
        self.failures = counter("source_failures", "Source failures by reason", "reason")
        self.single = {key: counter(name, doc) for name, key, doc in SINGLE_COUNTERS}

    def add(self, sid: str, c: dict[str, int]) -> None:
        for stage, family in self.stages.items():
            family.add_metric([sid], c[stage])
        self.outcome.add_metric([sid, "result"], c["results"])
        self.outcome.add_metric([sid, "dropped"], sum(c[r] for r in DROP_REASONS))
        for family, reasons in (
            (self.dropped, DROP_REASONS), (self.packets, PACKET_DROPS),
            (self.failures, SOURCE_FAILURES),
        ):  # fmt: skip
            for reason in reasons:
                family.add_metric([sid, reason], c[reason])
        for key, family in self.single.items():
            family.add_metric([sid], c[key])

    def families(self) -> tuple[CounterMetricFamily, ...]:
        return (*self.stages.values(), self.outcome, self.dropped, self.packets, self.failures,
                *self.single.values())  # fmt: skip


class _LatencyFamilies:
    """The per-stream latency families: histogram, clock, SLO and breaches."""

    def __init__(self) -> None:
        self.seconds = HistogramMetricFamily(
            P + "result_latency_seconds",
            "End-to-end latency of the stream's results (from capture, else from decode)",
            labels=["stream"],
        )
        self.clock = GaugeMetricFamily(
            P + "stream_latency_from", "1 for the clock the last latency was measured from",
            labels=["stream", "clock"],
        )  # fmt: skip
        self.slo = GaugeMetricFamily(
            P + "latency_slo_seconds", "The stream's latency objective", labels=["stream"]
        )
        self.breaches = CounterMetricFamily(
            P + "slo_breaches", "Results later than the stream's latency objective",
            labels=["stream"],
        )  # fmt: skip

    def add(self, sid: str, stream: IngestStream) -> None:
        latency = stream.latency
        buckets, total = latency.histogram()
        self.seconds.add_metric([sid], buckets, total)
        for clock in LatencyFrom:
            self.clock.add_metric([sid, clock.value], 1.0 if latency.source is clock else 0.0)
        if latency.slo_ms is not None:
            self.slo.add_metric([sid], latency.slo_ms / 1000)
            self.breaches.add_metric([sid], latency.breaches)

    def families(self) -> tuple[Metric, ...]:
        return (self.seconds, self.clock, self.slo, self.breaches)


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
    """Add the stream collector to ``registry`` (the ingest's private one), and the shard
    collector when the ingest is sharded (:mod:`ingest.shards`)."""
    registry.register(StreamCollector(service))
    if service.sharded is not None:
        registry.register(ShardCollector(service.sharded.coordinator))
