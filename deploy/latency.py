"""Round trips to the workers, regions by latency, and latency budgets (issue 18).

**Measuring.** What matters to a stream is the way from the ingest (beside the cameras)
to its worker, not from the orchestrator, which may run anywhere. So the ingest measures:
for every ready worker, as soon as it is ready and then every ``rtt_interval_s``, the
orchestrator asks the ingest ``POST /v1/rtt`` (:mod:`ingest.rtt_probe`), which opens a
tunnel to the worker as it does for frames (its token, TLS and CA) and sends
``rtt_pings`` WebSocket pings on it, then ``PROBE_FRAMES`` probe frames; the answer
is the pings' median and the frames' median less it (the worker's processing as the
ingest sees it: its queueing, batching, decoding, inference). The worker's ``rtt_ms``
and ``processing_ms`` (its record, ``/v1/pods``) are the medians of its last
``WINDOW`` measurements. A measurement that fails keeps the previous figures (and is
retried after the interval); a worker never measured has none. A reconcile pass waits
at most ``WAIT_S`` for the measurements it started; one still running is taken on a later
pass. Without an ingest to ask (``ingest_url`` unset) nothing is measured and placement
is as before.

**Regions.** A tier names the region its data centres are in (``region``); a region's
round trip is the median of its measured workers'. A worker not measured yet counts
with its region's figure; a worker of a tier without a region is a region of its own.

**Processing.** Until the ingest measured it, a worker's processing time is its ``/info``
``ms_per_inference`` (a full batch's inference in its warm-up benchmark). A frame's
expected latency on a worker is its round trip plus its processing time.

**Budgets.** Placement (:mod:`deploy.placement`) puts a stream with ``latency_slo_ms``
where the expected latency fits; when nowhere with room does, on the fastest worker with
room, and the breach is reported: an event ``slo_breach`` (and ``slo_met`` once it fits
again, or the stream left), the stream's ``slo_breach`` in ``/v1/streams`` and
``/v1/fleet`` (``{"worker", "expected_ms", "slo_ms", "rtt_ms", "processing_ms"}``), and the
metrics ``framerelay_orch_slo_breach_streams`` and ``framerelay_orch_worker_rtt_seconds``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import statistics
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx

from deploy.ingest_link import IngestToken, ingest_urls
from deploy.models import PodRecord, WorkerState
from deploy.placement import SloBreach, Slot
from deploy.settings import OrchestratorSettings
from deploy.tls import describe_http_error, verify_context
from framerelay.auth import TokenIssuer

log = logging.getLogger(__name__)
WINDOW = 5
"""Measurements per worker whose median is its ``rtt_ms`` (and ``processing_ms``)."""
PROBE_FRAMES = 3
WAIT_S = 2.0
"""How long a reconcile pass waits for the measurements it started (or that still run)."""
MAX_RTT_MS = 600_000.0
Event = tuple[str, str, str, str, dict[str, object]]
"""(kind, worker, reason, stream, detail) of a fleet event."""


@dataclass(frozen=True, slots=True)
class RoundTrip:
    """One measurement: the round trip from the ingest and the worker's processing, ms."""

    rtt_ms: float
    processing_ms: float | None = None


class RttSource(Protocol):
    async def measure(self, worker: str, url: str, tls_name: str | None) -> RoundTrip | None:
        """The round trip from the ingest to the worker; None when it failed."""
        ...

    async def aclose(self) -> None: ...


class NoRtt:
    """Nothing to measure with (no ingest to ask; simulations)."""

    async def measure(self, worker: str, url: str, tls_name: str | None) -> RoundTrip | None:
        return None

    async def aclose(self) -> None:
        return None


class IngestRtt:
    """Asks the ingest (``POST /v1/rtt``); with several replicas, the first that answers."""

    def __init__(
        self, base_url: str, issuer: TokenIssuer, *, pings: int = 5, timeout_s: float = 15.0,
        ca: Path | None = None,
    ) -> None:  # fmt: skip
        verify = verify_context(ca, "the ingest API") if ca else True
        self._https = [httpx.AsyncClient(base_url=u, timeout=timeout_s, verify=verify)
                       for u in ingest_urls(base_url)]  # fmt: skip
        self._token = IngestToken(issuer)
        self.pings = pings

    async def measure(self, worker: str, url: str, tls_name: str | None) -> RoundTrip | None:
        body: dict[str, object] = {"worker_id": worker, "url": url, "pings": self.pings,
                                   "frames": PROBE_FRAMES}  # fmt: skip
        if tls_name is not None:
            body["tls_server_name"] = tls_name
        for http in self._https:
            ms = await self._ask(http, body)
            if ms is not None:
                return ms
        return None

    async def _ask(self, http: httpx.AsyncClient, body: dict[str, object]) -> RoundTrip | None:
        headers = {"Authorization": f"Bearer {self._token.get()}"}
        try:
            resp = await http.post("/v1/rtt", json=body, headers=headers)
        except httpx.HTTPError as exc:
            log.warning("round trip to %s: the ingest %s is unreachable: %s", body["worker_id"],
                        http.base_url, describe_http_error(exc))  # fmt: skip
            return None
        if resp.status_code != 200:
            log.warning("round trip to %s: the ingest said HTTP %d %s", body["worker_id"],
                        resp.status_code, resp.text[:200])  # fmt: skip
            return None
        return _rtt_of(resp)

    async def aclose(self) -> None:
        await asyncio.gather(*(http.aclose() for http in self._https))


def _rtt_of(resp: httpx.Response) -> RoundTrip | None:
    """The ingest's answer, if its ``rtt_ms`` is a plausible number (``processing_ms``
    too, else None)."""
    try:
        body = resp.json()
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    rtt = _ms(body.get("rtt_ms"))
    return None if rtt is None else RoundTrip(rtt, _ms(body.get("processing_ms")))


def _ms(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    ms = float(value)
    return ms if math.isfinite(ms) and 0 <= ms <= MAX_RTT_MS else None


def rtt_source(settings: OrchestratorSettings, issuer: TokenIssuer) -> RttSource:
    """The ingest of ``ingest_url`` measures; without one, nothing does."""
    if not settings.ingest_url:
        return NoRtt()
    return IngestRtt(settings.ingest_url, issuer, pings=settings.rtt_pings, ca=settings.ingest_ca)


@dataclass
class Latency:
    """The fleet's round trips and latency breaches (see the module)."""

    source: RttSource = field(default_factory=NoRtt)
    interval_s: float = 30.0
    wait_s: float = WAIT_S
    samples: dict[str, collections.deque[float]] = field(default_factory=dict)
    processing: dict[str, collections.deque[float]] = field(default_factory=dict)
    measured_at: dict[str, float] = field(default_factory=dict)
    breaches: dict[str, SloBreach] = field(default_factory=dict)
    """Streams placed over their budget now, as the last placement found."""
    tiers: dict[str, float] = field(default_factory=dict)
    """Each tier's expected latency (ms) as last measured: kept while it has no worker, so
    the scaler does not open a pod again and again in a tier known to miss a budget."""
    _running: dict[str, asyncio.Task[RoundTrip | None]] = field(default_factory=dict)

    def tier_expected(self, pods: Iterable[PodRecord]) -> dict[str, float]:
        """Each measured tier's expected latency: the median over its ready, measured
        workers of round trip plus processing (the last figure known for a tier without)."""
        seen: dict[str, list[float]] = {}
        for rec in pods:
            for w in rec.workers():
                if w.ready and w.rtt_ms is not None:
                    seen.setdefault(rec.tier, []).append(w.rtt_ms + (w.processing_ms or 0.0))
        self.tiers.update({t: statistics.median(v) for t, v in seen.items()})
        return dict(self.tiers)

    async def measure(self, workers: Iterable[WorkerState], now: float) -> None:
        """Start measuring the ready workers that are due (new, or ``interval_s`` since
        the last), wait up to ``wait_s`` for the measurements running, and fold those done
        into ``workers`` (the others are folded in on a later pass: a worker that does not
        answer never holds the reconcile loop)."""
        by_name = {w.name: w for w in workers}
        self._forget(set(by_name))
        for w in by_name.values():
            if w.ready and w.tunnel_url and w.name not in self._running and self._due(w.name, now):
                self.measured_at[w.name] = now
                self._running[w.name] = asyncio.create_task(self._one(w), name=f"rtt-{w.name}")
        if self._running:
            await asyncio.wait(self._running.values(), timeout=self.wait_s)
        for name, task in list(self._running.items()):
            if task.done():
                del self._running[name]
                self._apply(by_name.get(name), _result(task))

    def _forget(self, known: set[str]) -> None:
        """A worker gone: its figures and its running measurement go too."""
        for name in (set(self.measured_at) | set(self.samples)) - known:
            for book in (self.samples, self.processing, self.measured_at):
                book.pop(name, None)
            task = self._running.pop(name, None)
            if task is not None:
                task.cancel()

    def _apply(self, worker: WorkerState | None, trip: RoundTrip | None) -> None:
        if worker is None or trip is None:
            return
        worker.rtt_ms = _fold(self.samples, worker.name, trip.rtt_ms)
        if trip.processing_ms is not None:
            worker.processing_ms = _fold(self.processing, worker.name, trip.processing_ms)

    async def aclose(self) -> None:
        """Cancel the measurements running; close the source."""
        for task in self._running.values():
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        self._running.clear()
        await self.source.aclose()

    def _due(self, name: str, now: float) -> bool:
        at = self.measured_at.get(name)
        return at is None or now - at >= self.interval_s or now < at

    async def _one(self, worker: WorkerState) -> RoundTrip | None:
        assert worker.tunnel_url is not None  # noqa: S101 - only workers with one are due
        return await self.source.measure(worker.name, worker.tunnel_url, worker.tls_server_name)

    def report(self, found: Mapping[str, SloBreach]) -> Iterator[Event]:
        """Fleet events for what changed since the last placement: ``slo_breach`` for a
        stream newly over its budget (or over it on another worker), ``slo_met`` for one
        no longer over it."""
        for sid, late in sorted(found.items()):
            old = self.breaches.get(sid)
            if old is None or old.worker != late.worker:
                why = (f"expected {late.expected_ms:.0f} ms (round trip {late.rtt_ms:.0f} + "
                       f"processing {late.processing_ms:.0f}) > budget {late.slo_ms:g} ms: "
                       "no worker with room fits it")  # fmt: skip
                yield "slo_breach", late.worker, why, sid, late.as_dict()
        for sid in sorted(set(self.breaches) - set(found)):
            why = "no longer placed over its latency budget"
            yield "slo_met", self.breaches[sid].worker, why, sid, {}
        self.breaches = dict(found)

    def view(self, stream: str) -> dict[str, object] | None:
        """The stream's breach for the API (None: none)."""
        late = self.breaches.get(stream)
        return None if late is None else late.as_dict()


def _result(task: asyncio.Task[RoundTrip | None]) -> RoundTrip | None:
    """A finished measurement's answer; None when it failed or was cancelled."""
    if task.cancelled():
        return None
    error = task.exception()
    if error is not None:
        log.warning("round trip measurement failed: %s: %s", type(error).__name__, error)
        return None
    return task.result()


def _fold(windows: dict[str, collections.deque[float]], name: str, ms: float) -> float:
    """Add ``ms`` to the worker's window; the window's median."""
    window = windows.setdefault(name, collections.deque(maxlen=WINDOW))
    window.append(ms)
    return round(statistics.median(window), 3)


def region_rtts(pods: Iterable[PodRecord], settings: OrchestratorSettings) -> dict[str, float]:
    """Each region's round trip: the median of its ready, measured workers'."""
    seen: dict[str, list[float]] = {}
    for rec in pods:
        region = region_of(settings, rec.tier)
        for w in rec.workers():
            if region is not None and w.ready and w.rtt_ms is not None:
                seen.setdefault(region, []).append(w.rtt_ms)
    return {r: statistics.median(v) for r, v in seen.items()}


def region_of(settings: OrchestratorSettings, tier: str) -> str | None:
    cfg = settings.tier(tier)
    return cfg.region if cfg is not None else None


def annotate(
    slots: list[Slot], pods: Mapping[str, PodRecord], settings: OrchestratorSettings
) -> None:
    """Give each slot its region, round trips and processing time, for placement."""
    regions = region_rtts(pods.values(), settings)
    workers = {w.name: (rec, w) for rec in pods.values() for w in rec.workers()}
    for slot in slots:
        rec, worker = workers[slot.name]
        slot.region = region_of(settings, rec.tier)
        here = regions.get(slot.region) if slot.region is not None else None
        slot.rtt_ms = worker.rtt_ms if worker.rtt_ms is not None else here
        slot.region_rtt_ms = here if here is not None else worker.rtt_ms
        slot.processing_ms = worker.processing_ms or 0.0
