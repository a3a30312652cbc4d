"""The application heartbeat of one tunnel: its pings, its state, and its streams' stalls.

:class:`Pinger` sends WebSocket pings of the ingest's own every
``interval_s``, one outstanding at a time, besides the library's keepalive
(which only closes a connection after tens of seconds). :class:`TunnelMonitor`
holds the tunnel's state (:class:`ingest.tunnel_health.TunnelState`) and runs
beside each session: it feeds pongs and answered frames to
:class:`ingest.tunnel_health.TunnelHealth` and, on its verdicts, stalls or
unstalls every stream on the tunnel; :meth:`TunnelMonitor.watch` raises
:class:`TunnelStalled` once the tunnel should be closed and reconnected. A
tunnel that was up and stays down longer than the threshold stalls its
streams too. A stream stays ``STALLED`` until the tunnel recovers in the same
session or the stream's next result (after a reconnect, or on another worker).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import cast

from websockets.asyncio.client import ClientConnection

from framerelay.errors import FramerelayError
from ingest.stream import IngestStream
from ingest.tunnel_health import TunnelHealth, TunnelState, Verdict

log = logging.getLogger(__name__)
MIN_SLEEP_S = 0.01


class TunnelStalled(FramerelayError):
    """The worker stopped answering for too long: the tunnel is closed and reconnected."""


class Pinger:
    def __init__(
        self, ws: ClientConnection, interval_s: float, on_pong: Callable[[float, float], None]
    ) -> None:
        self._ws = ws
        self.interval_s = interval_s
        self._on_pong: Callable[[float, float], None] | None = on_pong
        self.outstanding: float | None = None
        """Send time of the ping waiting for its pong."""
        self.last = float("-inf")

    def due_in(self, now: float) -> float:
        """Seconds until the next ping (an interval while one is outstanding)."""
        if self.outstanding is not None:
            return self.interval_s
        return max(0.0, self.last + self.interval_s - now)

    async def tick(self) -> None:
        """Send a ping if one is due. ConnectionClosed if the connection is gone."""
        if self.outstanding is not None or time.monotonic() - self.last < self.interval_s:
            return
        sent = self.last = time.monotonic()
        try:
            async with asyncio.timeout(self.interval_s):
                waiter = await self._ws.ping()
        except TimeoutError:  # the send buffer is full: no pong will date this one
            return
        self.outstanding = sent
        # websockets returns the pong future itself (typed as an Awaitable)
        cast("asyncio.Future[float]", waiter).add_done_callback(lambda f: self._done(f, sent))

    def close(self) -> None:
        """The session ended: late pongs (or their cancellation) are ignored."""
        self._on_pong = None

    def _done(self, fut: asyncio.Future[float], sent: float) -> None:
        self.outstanding = None
        if self._on_pong is None or fut.cancelled() or fut.exception() is not None:
            return
        self._on_pong(sent, time.monotonic())


class TunnelMonitor:
    """State and health of one tunnel. ``streams``: the client's own dict (read live);
    ``on_change()``: called after every state change and stall."""

    def __init__(
        self,
        url: str,
        streams: Mapping[str, IngestStream],
        *,
        interval_s: float,
        stall_after_s: float,
        on_change: Callable[[], None],
    ) -> None:
        self.url = url
        self.interval_s = interval_s
        self.health = TunnelHealth(stall_after_s)
        self.state = TunnelState.IDLE
        self.state_since = time.time()
        self.stall_reason: str | None = None
        """Why the worker is not answering; kept across a reconnect until it answers again."""
        self.worker_id: str | None = None
        self._streams = streams
        self._on_change = on_change
        self._pinger: Pinger | None = None
        self._down_watch: asyncio.Task[None] | None = None

    @property
    def unhealthy(self) -> bool:
        """Stalled now, or not up again since a stall or a lost connection."""
        if self.state is TunnelState.STALLED:
            return True
        return self.state is not TunnelState.UP and self.stall_reason is not None

    @property
    def live(self) -> bool:
        return self._pinger is not None

    def set_state(self, state: TunnelState) -> None:
        if state is not self.state:
            self.state, self.state_since = state, time.time()
            self._notify()

    def up(self, ws: ClientConnection, worker_id: str) -> None:
        """A session started (HELLO received)."""
        self.worker_id = worker_id
        self.health.reset(time.monotonic())
        self._pinger = Pinger(ws, self.interval_s, self._on_pong)
        self._cancel_down_watch()
        self.set_state(TunnelState.UP)

    def down(self, *, stopping: bool, last_error: str | None) -> None:
        """The session (or the attempt) ended."""
        was_up = self._pinger is not None
        if self._pinger is not None:
            self._pinger.close()
            self._pinger = None
        self.set_state(TunnelState.IDLE if stopping else TunnelState.DOWN)
        if was_up and not stopping:
            self._cancel_down_watch()
            delay = self.health.threshold(self._min_fps())
            self._down_watch = asyncio.create_task(self._stall_if_still_down(delay, last_error))

    def stop(self) -> None:
        self._cancel_down_watch()
        self.set_state(TunnelState.IDLE)

    def added(self, stream: IngestStream) -> None:
        """A stream joined this tunnel: it shares the tunnel's stall."""
        if self.unhealthy and self.stall_reason is not None:
            stream.stall(self.stall_reason)

    def answered(self, stream: IngestStream, now: float, rtt: float | None) -> None:
        """The worker answered a frame of ``stream`` (a result or an error)."""
        self.health.result(now, rtt)
        if stream.stalled is not None:  # this worker answers: after a pause, or a move here
            stream.unstall(f"results from worker {self.worker_id}")
        if self.health.stalled:
            self._evaluate()
        if not self.health.stalled:  # e.g. the first result after a reconnect
            self.stall_reason = None

    async def watch(self) -> None:
        """Beside a session: ping, judge, and raise TunnelStalled when it must reconnect."""
        pinger = self._pinger
        if pinger is None:
            raise RuntimeError("watch() needs a session: call up() first")
        while True:
            await pinger.tick()
            if self._evaluate().reconnect:
                raise TunnelStalled(f"stalled too long ({self.stall_reason}); reconnecting")
            now = time.monotonic()
            wait = self.interval_s
            if not self.health.stalled:  # wake up just when the silence would be too long
                wait = min(pinger.due_in(now), self.health.next_check_in(now, self._min_fps()))
            await asyncio.sleep(min(max(wait, MIN_SLEEP_S), self.interval_s))

    def describe(self) -> dict[str, object]:
        now = time.monotonic()
        h = self.health
        rtt = h.rtt_p95()
        heartbeat = None if h.pong_at is None or not self.live else round(now - h.pong_at, 3)
        return {
            "state": self.state.value,
            "state_since": self.state_since,
            "stall_reason": self.stall_reason,
            "last_result_age_s": round(now - h.result_at, 3) if self.live else None,
            "last_heartbeat_age_s": heartbeat,
            "rtt_p95_ms": None if rtt is None else round(rtt * 1000, 3),
            "threshold_s": round(h.threshold(self._min_fps()), 3),
            "stalls": h.stalls,
        }

    def _on_pong(self, sent: float, now: float) -> None:
        self.health.pong(sent, now)
        if self.health.stalled:
            self._evaluate()

    def _evaluate(self) -> Verdict:
        verdict = self.health.check(time.monotonic(), self._oldest_inflight(), self._min_fps())
        if verdict.changed and verdict.stalled:
            self.stall_reason = f"worker {self.worker_id} not answering: {verdict.reason}"
            log.warning("tunnel to %s STALLED: %s", self.url, self.stall_reason)
            for stream in self._streams.values():
                stream.stall(self.stall_reason)
            self.set_state(TunnelState.STALLED)
        elif verdict.changed:
            log.info("tunnel to %s answers again (was: %s)", self.url, self.stall_reason)
            self.stall_reason = None
            for stream in self._streams.values():
                stream.unstall(f"worker {self.worker_id} answers again")
            self.set_state(TunnelState.UP)
        return verdict

    async def _stall_if_still_down(self, delay_s: float, last_error: str | None) -> None:
        await asyncio.sleep(delay_s)
        if self._pinger is None:
            self.stall_reason = self.stall_reason or (
                f"no tunnel to worker {self.worker_id} for {delay_s:.1f} s ({last_error})"
            )
            log.warning("tunnel to %s: %s", self.url, self.stall_reason)
            for stream in self._streams.values():
                stream.stall(self.stall_reason)
            self._notify()

    def _cancel_down_watch(self) -> None:
        if self._down_watch is not None:
            self._down_watch.cancel()
            self._down_watch = None

    def _oldest_inflight(self) -> float | None:
        sent = (t for s in self._streams.values() for t in s.window.inflight.values())
        return min(sent, default=None)

    def _min_fps(self) -> float | None:
        rates = (s.sampling_fps for s in self._streams.values() if s.sampling_fps > 0)
        return min(rates, default=None)

    def _notify(self) -> None:
        try:
            self._on_change()
        except Exception:  # an observer's bug must not break the tunnel
            log.exception("tunnel state observer failed")
