"""The fleet's event log: what happened to pods and streams, and why (``GET /v1/events``).

Each event is one dict, JSON as it stands: ``seq`` (1, 2, ... in this process),
``t`` (Unix time, the orchestrator's clock), ``kind``, ``pod``, ``stream``
(None for a pod's event), ``reason`` (one line: why it happened), then what
else the kind tells (``tier``, ``spot``, ``error``, ``old``/``new`` worker ...).

Kinds: ``created``, ``create_failed``, ``no_capacity``, ``adopted``, ``ready``,
``unhealthy`` (a failed health check), ``replaced`` (an unhealthy pod
terminated and forgotten; its tier creates another), ``budget_exhausted``,
``preempted`` (a spot pod gone or exited), ``vanished`` and ``exited``
(on-demand pods), ``failed`` (a pod the provider says will never serve, terminated
and replaced at once: RunPod's ERROR, or no public address), ``draining``,
``terminated_<why>`` (``orphan``, ``duplicate``, ``drained``, ``unhealthy``,
``by_operator``), ``moved`` (a
stream placed, re-homed off a lost worker, moved to a cheaper one or by an
operator's pin, or unplaced), ``redefined``, ``slo_breach`` (a stream placed over its
latency budget: ``expected_ms``, ``slo_ms``, ``rtt_ms``, ``processing_ms``; see
:mod:`deploy.latency`) and ``slo_met`` (no longer over it).

The log keeps the newest ``size`` events (500): the oldest go first. It lives in
the orchestrator that leads (the one that acts) and starts empty after a restart.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

EVENTS = 500
Event = dict[str, object]


class EventLog:
    """A bounded, ordered log of fleet events (see the module)."""

    def __init__(self, size: int = EVENTS) -> None:
        self._events: collections.deque[tuple[float, Event]] = collections.deque(maxlen=size)
        self._seq = 0

    @property
    def size(self) -> int:
        return self._events.maxlen or 0

    def record(
        self, t: float, kind: str, pod: str, reason: str, stream: str | None = None,
        **detail: object,
    ) -> Event:  # fmt: skip
        """Append one event (the oldest goes once ``size`` are held) and return it."""
        self._seq += 1
        event: Event = {"seq": self._seq, "t": t, "kind": kind, "pod": pod, "stream": stream,
                        "reason": reason, **detail}  # fmt: skip
        self._events.append((t, event))
        return event

    def since(self, t: float | None = None) -> list[Event]:
        """The events after time ``t`` (all held when None), oldest first."""
        return [e for at, e in self._events if t is None or at > t]

    def __iter__(self) -> Iterator[Event]:
        return iter([e for _, e in self._events])

    def __len__(self) -> int:
        return len(self._events)

    def __getitem__(self, index: int) -> Event:
        return self._events[index][1]
