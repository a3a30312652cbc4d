"""Address and TLS-client helpers shared by the services."""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path
from urllib.parse import urlsplit

from framerelay.errors import ConfigError


def is_loopback(host: str | None) -> bool:
    """True for ``localhost`` and any loopback address (127.0.0.0/8, ::1)."""
    if not host:
        return False
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def plain_http_problem(url: str, what: str) -> str | None:
    """Why a bearer token must not go to ``url`` (None: it may): plain ``http://`` is for
    this host (loopback) alone; ``what`` names the peer in the message."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        return f"{what}: not a valid URL; expected https://host[:port]"
    if parts.scheme == "http" and not is_loopback(host):
        return (
            f"refusing plain http:// to {what} at {host!r}: its token would cross the network "
            "unencrypted; use https://"
        )
    return None


def describe_http_error(exc: BaseException) -> str:
    """``ConnectError`` - or, when a certificate was refused, why (httpx -> httpcore -> ssl)."""
    cause: BaseException | None = exc
    for _ in range(6):
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"{type(exc).__name__}: TLS verification failed: {cause.verify_message}"
        cause = None if cause is None else (cause.__cause__ or cause.__context__)
    return type(exc).__name__


def verify_context(cafile: Path | str | None, what: str) -> ssl.SSLContext:
    """A client context that verifies peers against ``cafile`` (None: the system's CAs)."""
    try:
        ctx = ssl.create_default_context(cafile=str(cafile) if cafile else None)
    except (OSError, ssl.SSLError) as exc:
        reason = (
            getattr(exc, "strerror", None) or getattr(exc, "reason", None) or type(exc).__name__
        )
        raise ConfigError(f"cannot load the CA file for {what} ({cafile}): {reason}") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx
