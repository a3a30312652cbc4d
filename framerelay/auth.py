"""Signed, expiring, scoped tokens (HMAC-SHA256).

A token is ``fr1.<claims>.<signature>`` where ``claims`` is base64url JSON
``{"sub", "scope", "iat", "exp", "kid"}`` and ``signature`` is the base64url
HMAC-SHA256 of ``fr1.<claims>`` under the secret named by ``kid``.

Scopes are strings such as ``worker:gpu-a`` (may open a tunnel to worker
``gpu-a``) or ``stream:cam-1`` (may read results of stream ``cam-1``); ``*``
after the colon matches any id. Several secrets may be active at once (key
rotation): tokens are signed with the first and verified against any.

Error messages never contain a secret or the token itself.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from framerelay.errors import AuthError, ConfigError

PREFIX = "fr1"
MAX_TOKEN_LEN = 4096
MIN_SECRET_LEN = 16


@dataclass(frozen=True, slots=True)
class Claims:
    """What a verified token says."""

    sub: str
    scope: tuple[str, ...]
    iat: int
    exp: int
    kid: str

    def allows(self, wanted: str) -> bool:
        """True if one of the scopes grants ``wanted`` (``kind:id``)."""
        kind, _, ident = wanted.partition(":")
        return any(s == wanted or s == f"{kind}:*" for s in self.scope) and bool(ident)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenSigner:
    """Mints and verifies tokens with a set of named secrets."""

    def __init__(self, secrets: Sequence[str] | dict[str, str], *, leeway_s: float = 5.0) -> None:
        keys = (
            dict(secrets)
            if isinstance(secrets, dict)
            else {f"k{i}": s for i, s in enumerate(secrets)}
        )
        if not keys:
            raise ConfigError("no token secret configured: set FRAMERELAY_TOKEN_SECRETS")
        for kid, secret in keys.items():
            if len(secret) < MIN_SECRET_LEN:
                raise ConfigError(
                    f"token secret {kid!r} is shorter than {MIN_SECRET_LEN} characters; generate "
                    "one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
                )
        self._keys = {kid: s.encode() for kid, s in keys.items()}
        self._signing_kid = next(iter(self._keys))
        self._leeway = leeway_s

    def mint(
        self, sub: str, scope: Iterable[str], ttl_s: float, *, now: float | None = None
    ) -> str:
        """A token for ``sub`` granting ``scope`` for ``ttl_s`` seconds."""
        issued = int(time.time() if now is None else now)
        claims = {
            "sub": sub,
            "scope": list(scope),
            "iat": issued,
            "exp": issued + max(1, int(ttl_s)),
            "kid": self._signing_kid,
        }
        body = f"{PREFIX}.{_b64(json.dumps(claims, separators=(',', ':')).encode())}"
        return f"{body}.{_b64(self._sign(self._signing_kid, body))}"

    def _sign(self, kid: str, body: str) -> bytes:
        return hmac.new(self._keys[kid], body.encode(), hashlib.sha256).digest()

    def verify(self, token: str, required_scope: str, *, now: float | None = None) -> Claims:
        """Check signature, expiry and scope; raise AuthError saying which failed."""
        claims = self._verified_claims(token)
        t = time.time() if now is None else now
        if claims.exp + self._leeway < t:
            raise AuthError(
                f"token for {claims.sub!r} expired {int(t - claims.exp)} s ago; mint a new one"
            )
        if claims.iat - self._leeway > t:
            raise AuthError("token is issued in the future; check the clocks of issuer and server")
        if not claims.allows(required_scope):
            raise AuthError(
                f"token for {claims.sub!r} does not grant {required_scope!r} "
                f"(it grants {list(claims.scope)})"
            )
        return claims

    def _verified_claims(self, token: str) -> Claims:
        if len(token) > MAX_TOKEN_LEN:
            raise AuthError(f"token longer than {MAX_TOKEN_LEN} characters")
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != PREFIX:
            raise AuthError(f"malformed token: expected '{PREFIX}.<claims>.<signature>'")
        try:
            raw = json.loads(_unb64(parts[1]))
            sig = _unb64(parts[2])
        except (binascii.Error, ValueError, UnicodeDecodeError):
            raise AuthError("malformed token: bad base64 or JSON") from None
        claims = _claims_from(raw)
        if claims.kid not in self._keys:
            raise AuthError(f"token signed with unknown key id {claims.kid!r}")
        if not hmac.compare_digest(sig, self._sign(claims.kid, f"{parts[0]}.{parts[1]}")):
            raise AuthError("token signature does not match (wrong secret or tampered token)")
        return claims


def _claims_from(raw: object) -> Claims:
    if not isinstance(raw, dict):
        raise AuthError("malformed token: claims must be an object")
    try:
        scope = raw["scope"]
        if not isinstance(scope, list) or not all(isinstance(s, str) for s in scope):
            raise TypeError
        return Claims(
            sub=str(raw["sub"]),
            scope=tuple(scope),
            iat=int(raw["iat"]),
            exp=int(raw["exp"]),
            kid=str(raw["kid"]),
        )
    except (KeyError, TypeError, ValueError):
        raise AuthError("malformed token: claims need sub, scope, iat, exp, kid") from None


def bearer_token(header_value: str | None) -> str:
    """Extract the token from an ``Authorization: Bearer ...`` header."""
    if not header_value:
        raise AuthError("missing Authorization header; send 'Authorization: Bearer <token>'")
    scheme, _, token = header_value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthError("Authorization header must be 'Bearer <token>'")
    return token.strip()
