"""TLS contexts of the orchestrator: its API server, and verifying pods and the ingest."""

from __future__ import annotations

import ssl
from pathlib import Path

from framerelay.errors import ConfigError
from framerelay.net import describe_http_error as describe_http_error  # shared with the ingest
from framerelay.net import verify_context as verify_context


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
