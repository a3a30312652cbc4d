"""Tokens and key sets for tests (the same code the services use)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from typing import Any

from framerelay.auth import KeySet, TokenIssuer
from framerelay.auth.keys import generate


def b64url(data: bytes) -> str:
    """Base64url without padding, as in a JWT's header, claims and signature."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hs256_by_hand(
    claims: Mapping[str, Any], key: bytes, header: Mapping[str, str] | None = None
) -> str:
    """An HS256 JWT of ``claims`` under ``key``, made without PyJWT (which rightly refuses
    to HMAC with what looks like a public key): the algorithm-confusion forgery an
    attacker would try. ``header``: its fields besides ``alg`` (default ``typ: JWT``)."""
    head = b64url(json.dumps({**(header or {"typ": "JWT"}), "alg": "HS256"}).encode())
    signing_input = f"{head}.{b64url(json.dumps(claims).encode())}"
    mac = hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64url(mac)}"


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
