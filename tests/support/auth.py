"""Tokens and key sets for tests (the same code the services use)."""

from __future__ import annotations

import base64
from collections.abc import Iterable

from framerelay.auth import KeySet, TokenIssuer
from framerelay.auth.keys import generate


def b64url(data: bytes) -> str:
    """Base64url without padding, as in a JWT's header, claims and signature."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hs_keys(secret: str) -> KeySet:
    """The HS256 key a single-host ``FRAMERELAY_TOKEN_SECRETS=secret`` gives."""
    return KeySet.from_secrets([secret])


def mint(
    secret_or_keys: str | KeySet,
    scopes: Iterable[str] | str,
    aud: str,
    ttl: float = 60.0,
    *,
    now: float | None = None,
    sub: str = "test",
) -> str:
    """A token under ``secret_or_keys`` for audience ``aud`` (ingest/orchestrator/worker)."""
    keys = hs_keys(secret_or_keys) if isinstance(secret_or_keys, str) else secret_or_keys
    wanted = [scopes] if isinstance(scopes, str) else list(scopes)
    return TokenIssuer(keys).mint(sub, wanted, ttl, aud=aud, now=now)


def ed_keys(kid: str | None = None) -> KeySet:
    """A fresh private Ed25519 key set."""
    return KeySet([generate("EdDSA", kid)])
