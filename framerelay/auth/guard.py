"""One gate for every authenticated endpoint: verify, scope, count, throttle.

Failed authentications (401) are counted per client address; once an address
has ``max_failures`` of them within ``window_s``, its further failures are
answered 429 (``Retry-After``: the window's end) instead of 401. The token is
always checked first: a valid one is accepted whatever others failed from the
same address (a proxy, a NAT, a hostile process on the same host), so only
the failures are throttled, never an authenticated client. The address is the
one the server trusts: the peer, or what a trusted proxy forwarded
(:mod:`framerelay.listeners`). Every refusal is reported to
``on_refusal(reason)`` so each service counts them in its metrics
(``missing``, ``malformed``, ``bad_signature``, ``unknown_key``, ``expired``,
``not_yet_valid``, ``wrong_audience``, ``scope``, ``throttled``). The table of
peers is bounded (least recently seen forgotten first).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from framerelay.auth.tokens import Claims, Forbidden, TokenVerifier, Unauthorized, bearer_token
from framerelay.errors import AuthError

MAX_PEERS = 10_000


class Throttled(AuthError):
    """429: another failed authentication from an address that failed too often."""

    status = 429
    reason = "throttled"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(slots=True)
class _Window:
    start: float
    failures: int


class FailureLimiter:
    """Fixed-window count of failures per key (a client address, or an address and a
    verified token subject)."""

    def __init__(
        self,
        max_failures: int = 20,
        window_s: float = 60.0,
        *,
        max_peers: int = MAX_PEERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self._peers: OrderedDict[str, _Window] = OrderedDict()
        self._max_peers = max_peers
        self._clock = clock

    def _window(self, peer: str) -> _Window | None:
        win = self._peers.get(peer)
        if win is not None and self._clock() - win.start >= self.window_s:
            del self._peers[peer]
            return None
        return win

    def retry_after(self, peer: str) -> float | None:
        """Seconds until ``peer`` may try again, or None when it is not throttled."""
        win = self._window(peer)
        if win is None or win.failures < self.max_failures:
            return None
        return max(0.1, win.start + self.window_s - self._clock())

    def failed(self, peer: str) -> None:
        win = self._window(peer)
        if win is None:
            win = self._peers[peer] = _Window(self._clock(), 0)
        win.failures += 1
        self._peers.move_to_end(peer)
        while len(self._peers) > self._max_peers:
            self._peers.popitem(last=False)


class AuthGuard:
    """``check(authorization, scope, peer) -> Claims`` or a 401/403/429 error."""

    def __init__(
        self,
        verifier: TokenVerifier,
        *,
        limiter: FailureLimiter | None = None,
        on_refusal: Callable[[str], None] | None = None,
    ) -> None:
        self.verifier = verifier
        self.limiter = limiter or FailureLimiter()
        self._on_refusal = on_refusal or (lambda reason: None)

    def check(self, authorization: str | None, scope: str | None, peer: str) -> Claims:
        """The token's claims; 401 (429 once ``peer`` failed too often), or 403."""
        try:
            return self.verifier.verify(bearer_token(authorization), scope)
        except Unauthorized as exc:
            wait = self.limiter.retry_after(peer)
            if wait is not None:
                self._on_refusal(Throttled.reason)
                raise Throttled(
                    f"too many failed authentications from {peer}; retry in {wait:.0f} s", wait
                ) from None
            self.limiter.failed(peer)
            self._on_refusal(exc.reason)
            raise
        except Forbidden:
            self._on_refusal(Forbidden.reason)
            raise

    def refused(self, reason: str) -> None:
        """Count a refusal decided elsewhere (e.g. a second stream a token lacks)."""
        self._on_refusal(reason)


def status_of(exc: AuthError) -> int:
    """The HTTP status for an auth error (401 unless it says otherwise)."""
    return int(getattr(exc, "status", 401))
