"""What a worker trusts: the tunnel token verifier and its TLS context.

A worker (a rented pod) verifies tunnel tokens with the PUBLIC key set of the
primary cloud (``FRAMERELAY_WORKER_TUNNEL_KEYS``), or with HS256 secrets on a
single host. It refuses to start with a private key: a pod holding one could
mint tokens for every service. Its certificate comes as files or as PEM text
from the provider's environment (written to a private temporary folder for
``ssl`` to load, removed as soon as it is loaded).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path

from framerelay.auth import AUD_WORKER, AuthGuard, FailureLimiter, TokenVerifier
from framerelay.auth.config import load_keys
from framerelay.errors import ConfigError
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.settings import WorkerSettings

KEYS_ENV = "FRAMERELAY_WORKER_TUNNEL_KEYS"


def tunnel_guard(settings: WorkerSettings, metrics: WorkerMetrics) -> AuthGuard:
    """The gate of ``/v1/tunnel`` and ``/info`` (and ``/metrics`` with ``metrics_auth``)."""
    _refuse_signing_keys(settings)
    keys = load_keys(settings.tunnel_keys, settings.token_secrets, jwks_env=KEYS_ENV)
    if keys is None:
        raise ConfigError(
            f"the worker has no key to verify tunnel tokens: set {KEYS_ENV}_FILE to the public "
            "key set ('framerelay keys public'), or FRAMERELAY_TOKEN_SECRETS on a single host"
        )
    verifier = TokenVerifier(keys, AUD_WORKER, leeway_s=settings.token_leeway_s)
    limiter = FailureLimiter(settings.auth_max_failures, settings.auth_window_s)
    return AuthGuard(
        verifier,
        limiter=limiter,
        on_refusal=lambda reason: metrics.auth_failures.labels(reason).inc(),
    )


def _refuse_signing_keys(settings: WorkerSettings) -> None:
    """A key in the tunnel key set that can mint (private, or an HS256 secret) is refused."""
    jwks = load_keys(settings.tunnel_keys, None, jwks_env=KEYS_ENV)
    minting = [k.kid for k in jwks or () if k.private or k.symmetric]
    if minting:
        raise ConfigError(
            f"{KEYS_ENV} holds key(s) that can sign tokens {minting}: a worker must get only "
            "the public half ('framerelay keys public KEYS.jwks'); a pod holding a signing key "
            "could mint tokens for every service"
        )


@contextlib.contextmanager
def pem_files(cert: str, key: str) -> Iterator[tuple[Path, Path]]:
    """PEM text as files for ``ssl``: 0600 files in a new 0700 folder, removed on exit.

    The folder is removed as soon as ``ssl`` has loaded them (``atexit`` as well,
    should the process end in between), so the key is on disk only for that moment.
    """
    folder = Path(tempfile.mkdtemp(prefix="framerelay-tls-"))  # 0700

    def remove() -> None:
        shutil.rmtree(folder, ignore_errors=True)

    atexit.register(remove)
    try:
        paths = (folder / "cert.pem", folder / "key.pem")
        for path, text in zip(paths, (cert, key), strict=True):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
        yield paths
    finally:
        remove()
        atexit.unregister(remove)


def server_ssl_context(settings: WorkerSettings) -> ssl.SSLContext | None:
    """TLS (and mTLS when ``tls_client_ca`` is set) from the settings."""
    if settings.tls_cert_pem is not None and settings.tls_key_pem is not None:
        pems = settings.tls_cert_pem.get_secret_value(), settings.tls_key_pem.get_secret_value()
        with pem_files(*pems) as (cert, key):
            return _context(settings, cert, key, "FRAMERELAY_WORKER_TLS_CERT_PEM")
    if settings.tls_cert is None:
        if settings.tls_client_ca is not None:
            raise ConfigError("tls_client_ca (mTLS) needs tls_cert and tls_key as well")
        return None
    return _context(settings, settings.tls_cert, settings.tls_key, str(settings.tls_cert))


def _context(settings: WorkerSettings, cert: Path, key: Path | None, what: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
        if settings.tls_client_ca is not None:
            ctx.load_verify_locations(settings.tls_client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS certificate and key ({what}): {exc}") from None
    return ctx
