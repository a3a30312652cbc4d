"""Python client of the results API, and an aligner to put results on frames.

Subscribe (typed results, reconnecting, resuming where it left off)::

    async for result in subscribe("wss://ingest:8080/v1/results", streams=["cam-1"],
                                  token=lambda: read_token(), ca_file="ingest-ca.pem"):
        print(result.stream_id, result.epoch, result.pts, len(result.detections))

The token is a JWT for audience ``framerelay-ingest`` granting ``results:cam-1``
(or ``results:*``), e.g. from ``framerelay token mint --aud ingest --scope
results:cam-1``. ``wss://`` URLs are verified against ``ca_file`` (or the
system CAs); ``client_cert``/``client_key`` answer an ingest that asks for
mTLS. A certificate that does not verify raises :class:`ConfigError` at once
(retrying cannot fix it).

Align results with the frames you decode yourself, by ``(stream, epoch, pts)``::

    aligner = Aligner(tolerance_s=0.02)
    aligner.add(result)                                   # as results arrive
    hit = aligner.match("cam-1", frame_epoch, frame.pts, frame.time_base)

Messages are read tolerantly: fields this client does not know (a newer hub
adds optional ones within a version) are ignored, and a message of a type it
does not know is skipped and counted (``SubscribeState.skipped``).

Only ``websockets`` and ``pydantic`` are needed (no PyAV, FastAPI or Redis).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import random
import ssl as _ssl
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from urllib.parse import urlencode, urlsplit

from pydantic import ValidationError
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from framerelay.errors import AuthError, ConfigError, ProtocolError
from framerelay.results import ResultId, ResultRecord
from framerelay.schemas import (
    CloseCode,
    ErrorMessage,
    NoticeMessage,
    ResultMessage,
    SubscribedMessage,
    read_server_message,
)

log = logging.getLogger(__name__)
MAX_MESSAGE_BYTES = 1 << 20
Token = str | Callable[[], str] | None
PathLike = str | Path
_CERT_ALERTS = ("CERTIFICATE_REQUIRED", "UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_UNKNOWN")
"""TLS alerts by which a server refuses our client certificate (mTLS)."""


ServerMessage = SubscribedMessage | ResultMessage | NoticeMessage | ErrorMessage


@dataclass
class SubscribeState:
    """What a subscription has seen: the last durable id per stream, counters
    (``skipped``: messages of a type this client does not know)."""

    last_id: dict[str, ResultId] = field(default_factory=dict)
    connects: int = 0
    dropped: int = 0
    skipped: int = 0
    notices: list[NoticeMessage] = field(default_factory=list)
    last_error: ErrorMessage | None = None


def results_url(
    url: str,
    streams: Sequence[str],
    *,
    classes: Sequence[str] | None = None,
    min_confidence: float = 0.0,
    resume: Mapping[str, str | ResultId] | None = None,
) -> str:
    """``url`` with the subscription as query parameters."""
    params: list[tuple[str, str]] = [("stream", s) for s in streams]
    params += [("class", c) for c in classes or ()]
    if min_confidence > 0:
        params.append(("min_confidence", repr(min_confidence)))
    params += [("resume", f"{s}@{i}") for s, i in (resume or {}).items()]
    return f"{url}?{urlencode(params)}" if params else url


def tls_context(
    url: str,
    *,
    ssl: _ssl.SSLContext | None = None,
    ca_file: PathLike | None = None,
    client_cert: PathLike | None = None,
    client_key: PathLike | None = None,
) -> _ssl.SSLContext | None:
    """The TLS context for ``url``: None for ``ws://``; for ``wss://`` ``ssl`` as given,
    else one verifying against ``ca_file`` (default: the system CAs), with the client
    certificate for mTLS. :class:`ConfigError` for options that cannot work."""
    wanted = any(x is not None for x in (ssl, ca_file, client_cert, client_key))
    if not url.startswith("wss://"):
        if wanted:
            raise ConfigError("TLS options (ssl, ca_file, client_cert) need a wss:// URL")
        return None
    if ssl is not None:
        if ca_file is not None or client_cert is not None:
            raise ConfigError("give ssl= or ca_file=/client_cert=, not both")
        return ssl
    if client_key is not None and client_cert is None:
        raise ConfigError("client_key needs client_cert")
    try:
        ctx = _ssl.create_default_context(cafile=str(ca_file) if ca_file is not None else None)
    except (OSError, _ssl.SSLError) as exc:
        raise ConfigError(f"ca_file {str(ca_file)!r}: {_why(exc)}") from None
    ctx.minimum_version = _ssl.TLSVersion.TLSv1_2
    if client_cert is not None:
        try:
            ctx.load_cert_chain(str(client_cert), str(client_key) if client_key else None)
        except (OSError, _ssl.SSLError) as exc:
            raise ConfigError(f"client_cert {str(client_cert)!r}: {_why(exc)}") from None
    return ctx


def _why(exc: OSError | _ssl.SSLError) -> str:
    if isinstance(exc, _ssl.SSLError):
        return f"not a usable PEM certificate/key ({exc.reason or 'invalid'})"
    return exc.strerror or "cannot read it"


def _tls_refusal(exc: _ssl.SSLError, url: str) -> ConfigError | None:
    """A ConfigError for TLS failures that retrying cannot fix, else None."""
    host = urlsplit(url).hostname
    if isinstance(exc, _ssl.SSLCertVerificationError):
        return ConfigError(
            f"the results hub {host} has a TLS certificate that does not verify "
            f"({exc.verify_message}); pass ca_file= the CA that signed it"
        )
    reason = str(exc.reason or "")
    if any(alert in reason for alert in _CERT_ALERTS):
        return ConfigError(
            f"the results hub {host} refused this client's TLS certificate ({reason}); "
            "pass client_cert=/client_key= signed by the CA it trusts"
        )
    return None


async def subscribe(
    url: str,
    *,
    streams: Sequence[str],
    token: Token = None,
    classes: Sequence[str] | None = None,
    min_confidence: float = 0.0,
    resume: Mapping[str, str | ResultId] | None = None,
    state: SubscribeState | None = None,
    reconnect_max_s: float = 10.0,
    open_timeout_s: float = 10.0,
    ssl: _ssl.SSLContext | None = None,
    ca_file: PathLike | None = None,
    client_cert: PathLike | None = None,
    client_key: PathLike | None = None,
) -> AsyncIterator[ResultMessage]:
    """Results of ``streams`` as they come, forever.

    Reconnects with capped, jittered backoff after any disconnect and resumes
    from the last durable id seen per stream (the hub replays what was missed;
    nothing is yielded twice). ``token`` may be a callable, called at every
    connect (so an expired token is replaced). ``wss://`` is verified with
    ``ssl`` or ``ca_file`` (see :func:`tls_context`). Raises :class:`AuthError`
    when the hub refuses the token for good (a fixed token that is bad, expired
    or not granted) and :class:`ConfigError` for a subscription it rejects or a
    TLS certificate that does not verify.
    """
    ctx = tls_context(url, ssl=ssl, ca_file=ca_file, client_cert=client_cert,
                      client_key=client_key)  # fmt: skip
    st = state if state is not None else SubscribeState()
    st.last_id.update(_resume_points(resume))
    delay = 0.25
    while True:
        query = results_url(url, streams, classes=classes, min_confidence=min_confidence,
                            resume=st.last_id)  # fmt: skip
        headers = {"Authorization": f"Bearer {_token(token)}"} if token is not None else {}
        try:
            async with connect(query, additional_headers=headers, compression=None, ssl=ctx,
                               max_size=MAX_MESSAGE_BYTES, open_timeout=open_timeout_s,
                               proxy=None) as ws:  # fmt: skip
                st.connects += 1
                async for result in _results(ws, st):
                    delay = 0.25
                    yield result
            code = ws.close_code
        except (InvalidHandshake, ConnectionClosed, OSError, TimeoutError, InvalidURI) as exc:
            code = _failed(exc, token, url, mtls_hint=ctx is not None and client_cert is None)
        if code == CloseCode.TOKEN_EXPIRED and not callable(token):
            raise AuthError("the results token expired; pass a callable token to renew it")
        await asyncio.sleep(delay * random.uniform(0.8, 1.2))  # noqa: S311 - jitter
        delay = min(delay * 2, reconnect_max_s)


def _failed(exc: Exception, token: Token, url: str, *, mtls_hint: bool) -> int | None:
    """After a failed or lost connection: raise when retrying cannot help, else None."""
    if isinstance(exc, InvalidStatus):
        return _refused(exc, token)
    if isinstance(exc, _ssl.SSLError):
        refusal = _tls_refusal(exc, url)
        if refusal is not None:
            raise refusal from None
    if isinstance(exc, InvalidHandshake):  # e.g. closed before answering: a refused mTLS
        hint = "; if it requires a client certificate, pass client_cert=" if mtls_hint else ""
        log.warning("results hub closed the connection during the handshake (%s)%s", exc, hint)
        return None
    log.info("results connection lost: %s: %s", type(exc).__name__, exc)
    return None


def _resume_points(resume: Mapping[str, str | ResultId] | None) -> dict[str, ResultId]:
    """``resume`` as ids; ConfigError naming a malformed one."""
    out = {}
    for stream, rid in (resume or {}).items():
        try:
            out[stream] = rid if isinstance(rid, ResultId) else ResultId.parse(rid)
        except ValueError as exc:
            raise ConfigError(f"resume[{stream!r}]: {exc}") from None
    return out


def _token(token: Token) -> str:
    return token() if callable(token) else str(token)


def _refused(exc: InvalidStatus, token: Token) -> int | None:
    """Raise for refusals that retrying cannot fix; return None to retry."""
    status = exc.response.status_code
    try:
        reason = ErrorMessage.model_validate_json(exc.response.body).message
    except ValueError:
        reason = exc.response.body.decode(errors="replace")[:200]
    if status == 400:
        raise ConfigError(f"the hub rejected the subscription: {reason}")
    if status == 403 or (status == 401 and not callable(token)):
        raise AuthError(f"HTTP {status}: {reason}")
    if status == 429:
        log.warning("results hub throttles this address (HTTP 429): %s", reason)
        return None
    log.warning("results hub answered HTTP %d: %s; retrying", status, reason)
    return None


def _read(raw: str | bytes, st: SubscribeState) -> ServerMessage | None:
    """The hub's message (unknown fields ignored); None for a message type this client
    does not know (skipped, counted); ProtocolError for anything else unreadable."""
    try:
        return read_server_message(raw)
    except ValidationError as exc:
        if any(e["type"] == "union_tag_invalid" for e in exc.errors()):
            st.skipped += 1
            log.debug("skipped a results message of an unknown type: %.80r", raw)
            return None
        problem = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                            for e in exc.errors()[:3])  # fmt: skip
        raise ProtocolError(f"the results hub sent a message this client cannot read: "
                            f"{problem}") from None  # fmt: skip


async def _results(ws: ClientConnection, st: SubscribeState) -> AsyncIterator[ResultMessage]:
    first = _read(await ws.recv(), st)
    if not isinstance(first, SubscribedMessage):
        got = "an unknown type" if first is None else repr(first.type)
        raise ProtocolError(f"expected a 'subscribed' message first, got {got}")
    async for raw in ws:
        msg = _read(raw, st)
        if isinstance(msg, ResultMessage):
            last = st.last_id.get(msg.stream_id)
            if msg.id is not None:
                if last is not None and msg.id <= last:
                    continue  # already yielded before a reconnect
                st.last_id[msg.stream_id] = msg.id
            st.dropped = max(st.dropped, msg.dropped)
            yield msg
        elif isinstance(msg, NoticeMessage):
            st.notices = [*st.notices[-99:], msg]
            log.info("results hub notice (%s): %s", msg.code, msg.message)
        elif isinstance(msg, ErrorMessage):
            st.last_error = msg
            log.warning("results hub closes (%s): %s", msg.code, msg.message)


def _as_fraction(tb: Fraction | tuple[int, int] | None) -> Fraction | None:
    if tb is None or isinstance(tb, Fraction):
        return tb
    return Fraction(tb[0], tb[1])


@dataclass
class _Epoch:
    pts: list[int] = field(default_factory=list)
    results: dict[int, ResultRecord] = field(default_factory=dict)


class Aligner:
    """Results of recent frames, looked up by ``(stream_id, epoch, pts)``.

    A frame matches the result with exactly its PTS in the same stream and
    epoch, or else the result nearest in time within ``tolerance_s`` (results
    may be sampled at a lower rate than the video: the nearest is the one to
    draw). Frames of one epoch never match results of another. Memory is
    bounded: at most ``max_results`` per stream, oldest epochs and oldest
    results going first.
    """

    def __init__(self, tolerance_s: float = 0.02, max_results: int = 4096) -> None:
        self.tolerance_s = tolerance_s
        self.max_results = max_results
        self._streams: dict[str, dict[int, _Epoch]] = {}
        self._counts: dict[str, int] = {}

    def add(self, result: ResultRecord) -> None:
        epochs = self._streams.setdefault(result.stream_id, {})
        ep = epochs.setdefault(result.epoch, _Epoch())
        if result.pts not in ep.results:
            bisect.insort(ep.pts, result.pts)
            self._counts[result.stream_id] = self._counts.get(result.stream_id, 0) + 1
        ep.results[result.pts] = result
        while self._counts[result.stream_id] > self.max_results:
            self._evict(result.stream_id)

    def _evict(self, stream_id: str) -> None:
        epochs = self._streams[stream_id]
        oldest = min(epochs)
        ep = epochs[oldest]
        del ep.results[ep.pts.pop(0)]
        self._counts[stream_id] -= 1
        if not ep.pts:
            del epochs[oldest]

    def match(
        self,
        stream_id: str,
        epoch: int,
        pts: int,
        time_base: Fraction | tuple[int, int] | None = None,
    ) -> ResultRecord | None:
        """The result for this frame, or the nearest within the tolerance, or None.

        ``time_base`` is the frame's; give it when it may differ from the results'.
        """
        ep = self._streams.get(stream_id, {}).get(epoch)
        if ep is None or not ep.pts:
            return None
        some = ep.results[ep.pts[0]]
        result_tb = Fraction(*some.time_base)
        frame_tb = _as_fraction(time_base) or result_tb
        target = pts * frame_tb / result_tb
        exact = ep.results.get(int(target)) if target.denominator == 1 else None
        if exact is not None:
            return exact
        i = bisect.bisect_left(ep.pts, target)
        best = min(
            (ep.pts[j] for j in (i - 1, i) if 0 <= j < len(ep.pts)),
            key=lambda p: abs(p - target),
        )
        if abs(best - target) * result_tb <= self.tolerance_s:
            return ep.results[best]
        return None

    def __len__(self) -> int:
        return sum(self._counts.values())
