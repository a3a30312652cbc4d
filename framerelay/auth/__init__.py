"""Tokens, key sets and the gate every authenticated endpoint goes through.

* :mod:`framerelay.auth.keys` - JWKS key sets (EdDSA, ES256, HS256), rotation by name;
* :mod:`framerelay.auth.tokens` - JWT minting and verification (audience, scopes, leeway);
* :mod:`framerelay.auth.guard` - verify + count + throttle failed authentications;
* :mod:`framerelay.auth.web` - FastAPI route dependencies;
* :mod:`framerelay.auth.config` - key sets from settings.
"""

from framerelay.auth.guard import AuthGuard, FailureLimiter, Throttled
from framerelay.auth.keys import Key, KeySet
from framerelay.auth.tokens import (
    AUD_INGEST,
    AUD_ORCHESTRATOR,
    AUD_WORKER,
    Claims,
    Forbidden,
    TokenIssuer,
    TokenVerifier,
    Unauthorized,
    bearer_token,
    grants,
)

__all__ = [
    "AUD_INGEST",
    "AUD_ORCHESTRATOR",
    "AUD_WORKER",
    "AuthGuard",
    "Claims",
    "FailureLimiter",
    "Forbidden",
    "Key",
    "KeySet",
    "Throttled",
    "TokenIssuer",
    "TokenVerifier",
    "Unauthorized",
    "bearer_token",
    "grants",
]
