"""The ingest's credentials: tunnel tokens it mints, API tokens it checks, worker URLs it trusts.

* Tunnel: a fixed ``FRAMERELAY_INGEST_TOKEN``, or tokens minted per connect
  (audience ``framerelay-worker``, scope ``worker:<id>``) with the first
  private key of ``FRAMERELAY_SIGNING_KEYS`` / ``FRAMERELAY_TOKEN_SECRETS``.
* API: every route but ``/healthz`` and ``/readyz`` needs a token for audience
  ``framerelay-ingest`` (public halves of the same keys verify it). Refusals
  are counted in ``framerelay_ingest_auth_refused_total{reason}`` and failed
  authentications throttled per peer address (429).
* Workers: ``ws://`` to a host that is not this one is refused unless
  ``allow_insecure_workers`` (frames would cross the network in the clear).
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter

from framerelay.auth import AUD_INGEST, AuthGuard, FailureLimiter, KeySet, TokenIssuer
from framerelay.auth.config import load_keys, verifier
from framerelay.auth.tokens import worker_scope
from framerelay.errors import ConfigError
from framerelay.net import is_loopback
from ingest.settings import IngestSettings

TUNNEL_TOKEN_TTL_S = 3600.0
REFUSED_METRIC = "framerelay_ingest_auth_refused"
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME = rf"^{_LABEL}(\.{_LABEL})*$"
"""A DNS name (what a worker's certificate is checked against; at most 253 characters)."""


def ingest_keys(settings: IngestSettings) -> KeySet | None:
    return load_keys(settings.signing_keys, settings.token_secrets)


def tunnel_tokens(settings: IngestSettings) -> Callable[[str], str]:
    """``token_for(worker_id)``: the fixed token, or one minted per connect."""
    if settings.token is not None:
        fixed = settings.token.get_secret_value()
        return lambda worker_id: fixed
    keys = ingest_keys(settings)
    if keys is None:
        raise ConfigError(
            "no tunnel credentials: set FRAMERELAY_SIGNING_KEYS_FILE (the private key set "
            "from 'framerelay keys generate'), FRAMERELAY_INGEST_TOKEN (a token for audience "
            "worker granting worker:<id>) or, on a single host, FRAMERELAY_TOKEN_SECRETS"
        )
    issuer = TokenIssuer(keys)  # ConfigError when the set holds public keys only
    default = settings.worker_id  # the operator's own setting ("*": any worker, one host)

    def token_for(worker_id: str) -> str:
        # an id from a request (a placement, a probe) is one worker's name: never "*"
        scope = f"worker:{default}" if worker_id == default else worker_scope(worker_id)
        return issuer.mint("ingest", [scope], TUNNEL_TOKEN_TTL_S, aud="worker")

    return token_for


def api_guard(settings: IngestSettings, registry: CollectorRegistry) -> AuthGuard:
    """The gate of the ingest API (REST and results WebSocket); ConfigError without keys."""
    check = verifier(
        ingest_keys(settings),
        "ingest API",
        AUD_INGEST,
        settings.token_leeway_s,
        settings.revoked_tokens_file,
    )
    refused = Counter(
        REFUSED_METRIC,
        "Requests to the ingest API refused by authentication, by reason",
        ["reason"],
        registry=registry,
    )
    return AuthGuard(
        check,
        limiter=FailureLimiter(settings.auth_max_failures, settings.auth_window_s),
        on_refusal=lambda reason: refused.labels(reason).inc(),
    )


def check_worker_url(url: str, *, allow_insecure: bool, tls_server_name: str | None = None) -> None:
    """ConfigError for a worker URL this ingest must not use."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        raise ConfigError("worker URL is not a valid ws:// or wss:// URL") from None
    if parts.scheme not in ("ws", "wss") or not host:
        raise ConfigError("worker URL must be ws://host:port/... or wss://host:port/...")
    if parts.scheme == "wss":
        return
    if tls_server_name is not None:
        raise ConfigError("tls_server_name needs a wss:// worker URL")
    if not allow_insecure and not is_loopback(host):
        raise ConfigError(
            f"refusing plain ws:// to worker host {host!r}: frames and tokens would cross the "
            "network unencrypted; use wss:// (the worker's tls_cert, verified with "
            "FRAMERELAY_INGEST_TLS_CA) or set FRAMERELAY_INGEST_ALLOW_INSECURE_WORKERS=true"
        )
