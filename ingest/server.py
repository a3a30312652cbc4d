"""The uvicorn server of the ingest API (REST and the results WebSocket).

Plain HTTP/WS by default (on 127.0.0.1); with ``api_tls_cert`` and
``api_tls_key`` it serves HTTPS/WSS only, and with ``api_tls_client_ca`` too
every client must present a certificate signed by that CA (mTLS). Every
connection passes :mod:`framerelay.listeners` first (connection caps, header
and keep-alive timeouts, trusted proxies: ``FRAMERELAY_INGEST_LISTENER__*``).
"""

from __future__ import annotations

import socket
import ssl
from pathlib import Path
from typing import Any

import uvicorn

from framerelay.errors import ConfigError
from framerelay.listeners import ConnectionLimiter, uvicorn_options
from ingest.settings import IngestSettings, ResultsSettings

LISTENER_ENV = "FRAMERELAY_INGEST_LISTENER"


def _readable(label: str, path: Path | None) -> str | None:
    if path is None:
        return None
    if not path.is_file():
        raise ConfigError(f"{label}: {str(path)!r} is not a readable file")
    return str(path)


def tls_options(settings: IngestSettings) -> dict[str, Any]:
    """uvicorn's ssl options for the API (empty: plain HTTP)."""
    cert = _readable("FRAMERELAY_INGEST_API_TLS_CERT", settings.api_tls_cert)
    if cert is None:
        return {}
    key = _readable("FRAMERELAY_INGEST_API_TLS_KEY", settings.api_tls_key)
    opts: dict[str, Any] = {"ssl_certfile": cert, "ssl_keyfile": key}
    client_ca = _readable("FRAMERELAY_INGEST_API_TLS_CLIENT_CA", settings.api_tls_client_ca)
    if client_ca is not None:
        opts |= {"ssl_ca_certs": client_ca, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return opts


def api_server(app: Any, settings: IngestSettings) -> tuple[uvicorn.Server, socket.socket]:
    """A uvicorn server for the ingest API and its listening socket (see :func:`listen_socket`)."""
    results = settings.results
    limiter = ConnectionLimiter(settings.listener, LISTENER_ENV)
    config = uvicorn.Config(
        app,
        log_level="warning",
        log_config=None,  # through the root handler: --log-format json covers uvicorn too
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=5,
        ws_ping_interval=results.ping_interval_s or None,
        ws_ping_timeout=results.ping_timeout_s,
        ws_max_size=65_536,
        ws_per_message_deflate=False,
        **uvicorn_options(limiter),
        **tls_options(settings),
    )
    try:
        config.load()  # the certificate and key now: a bad one is a ConfigError at start
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot load the API's TLS certificate/key: {type(exc).__name__}: "
            f"{getattr(exc, 'strerror', None) or getattr(exc, 'reason', None) or 'invalid'}"
        ) from None
    return uvicorn.Server(config), listen_socket(settings.api_host, settings.api_port, results)


def listen_socket(host: str, port: int, results: ResultsSettings) -> socket.socket:
    """The API's listening socket, with the per-subscriber kernel limits set.

    Accepted sockets inherit them: a bounded send buffer (so a subscriber that
    stops reading blocks its sender soon, and the send timeout fires) and
    ``TCP_USER_TIMEOUT`` (the kernel drops a connection whose data has gone
    unacknowledged that long, which also frees sockets of peers that stopped
    reading but never close).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if results.send_buffer_bytes:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, results.send_buffer_bytes)
    if results.tcp_user_timeout_s and hasattr(socket, "TCP_USER_TIMEOUT"):
        ms = int(results.tcp_user_timeout_s * 1000)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, ms)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock
