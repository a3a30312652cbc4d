"""What to do when a tunnel cannot open: the error text plus a hint, in one line.

A worker serving TLS closes a plain ``ws://`` connection without a word, and
a worker requiring client certificates (mTLS) closes a ``wss://`` one without
a certificate the same way: websockets reports both as "did not receive a
valid HTTP response". The hint says which setting to look at; the ingest keeps
retrying, and the error shows in ``GET /v1/workers`` and the streams' status.
"""

from __future__ import annotations

import ssl

from websockets.exceptions import InvalidMessage

from framerelay.errors import ConfigError

WS_TO_TLS = (
    "the worker closed the connection without an HTTP answer: if it serves TLS, use "
    "wss:// in --worker-url / FRAMERELAY_INGEST_WORKER_URL (with --tls-ca)"
)
MTLS_REFUSED = (
    "the worker closed the TLS connection without an HTTP answer: it may require a client "
    "certificate (mTLS): set --tls-client-cert and --tls-client-key "
    "(FRAMERELAY_INGEST_TLS_CLIENT_CERT / _KEY) to one its CA signed"
)


def _closed_early(exc: BaseException) -> bool:
    cause: BaseException | None = exc
    for _ in range(4):
        if isinstance(cause, EOFError | ConnectionResetError):
            return True
        cause = None if cause is None else (cause.__cause__ or cause.__context__)
    return False


def misconfigured(exc: BaseException) -> bool:
    """The worker closed the connection before any HTTP answer: a setting to change
    (the streams show it too), not a network hiccup to wait out."""
    return isinstance(exc, InvalidMessage) and _closed_early(exc)


def describe(url: str, exc: BaseException) -> str:
    """``Type: message`` of a failed tunnel, with what to change when that is known."""
    said = f"{type(exc).__name__}: {exc}"
    if not misconfigured(exc):
        return said
    hint = WS_TO_TLS if url.startswith("ws://") else MTLS_REFUSED
    return f"{said}; {hint}"


def check_url(url: str, ssl_context: ssl.SSLContext | None, server_hostname: str | None) -> None:
    """A worker URL the tunnel can use with this TLS setup, or a ConfigError saying why not."""
    if not url.startswith(("ws://", "wss://")):
        raise ConfigError(f"worker URL must start with ws:// or wss://, got {url!r}")
    if server_hostname is not None and (ssl_context is None or not url.startswith("wss://")):
        raise ConfigError("a TLS server name needs a wss:// worker URL and a TLS context")
