"""TLS contexts of the orchestrator: its API server, and verifying pods and the ingest."""

from __future__ import annotations

import ssl
from pathlib import Path

from framerelay.errors import ConfigError


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


def api_ssl_options(
    cert: Path | None, key: Path | None, client_ca: Path | None
) -> dict[str, object]:
    """uvicorn's ssl options for the API (empty: plain HTTP); mTLS when ``client_ca``."""
    if cert is None:
        return {}
    for path in (cert, key, client_ca):
        if path is not None and not path.is_file():
            raise ConfigError(f"TLS file {str(path)!r} does not exist")
    opts: dict[str, object] = {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
    if client_ca is not None:
        opts |= {"ssl_ca_certs": str(client_ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return opts


def describe_http_error(exc: BaseException) -> str:
    """``ConnectError`` - or, when a certificate was refused, why (httpx -> httpcore -> ssl)."""
    cause: BaseException | None = exc
    for _ in range(6):
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"{type(exc).__name__}: TLS verification failed: {cause.verify_message}"
        cause = None if cause is None else (cause.__cause__ or cause.__context__)
    return type(exc).__name__
