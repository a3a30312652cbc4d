"""Key sets from settings: a JWKS (``FRAMERELAY_SIGNING_KEYS[_FILE]`` in the
primary cloud, the public ``FRAMERELAY_WORKER_TUNNEL_KEYS[_FILE]`` on a
worker) and/or HS256 shared secrets (``FRAMERELAY_TOKEN_SECRETS[_FILE]``, one
host only)."""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr

from framerelay.auth.keys import KeySet
from framerelay.auth.revocation import RevocationList
from framerelay.auth.tokens import TokenIssuer, TokenVerifier
from framerelay.errors import ConfigError

SIGNING_ENV = "FRAMERELAY_SIGNING_KEYS"
SECRETS_ENV = "FRAMERELAY_TOKEN_SECRETS"


def _text(value: SecretStr | str | None) -> str:
    if value is None:
        return ""
    return (value.get_secret_value() if isinstance(value, SecretStr) else value).strip()


def load_keys(
    jwks: SecretStr | str | None,
    secrets: SecretStr | str | None = None,
    *,
    jwks_env: str = SIGNING_ENV,
) -> KeySet | None:
    """The keys a service was given (JWKS keys, then shared secrets), or None when none."""
    sets: list[KeySet] = []
    text = _text(jwks)
    if text:
        sets.append(KeySet.from_json(text, source=jwks_env))
    shared = [s.strip() for s in _text(secrets).split(",") if s.strip()]
    if shared:
        sets.append(KeySet.from_secrets(shared))
    if not sets:
        return None
    keys = sets[0]
    for more in sets[1:]:
        keys = keys.merged(more)
    return keys


def require_keys(keys: KeySet | None, service: str, jwks_env: str = SIGNING_ENV) -> KeySet:
    if keys is None:
        raise ConfigError(
            f"the {service} has no token keys: set {jwks_env}_FILE to a key set from "
            f"'framerelay keys generate' (or {SECRETS_ENV} on a single host)"
        )
    return keys


def issuer(keys: KeySet | None, service: str) -> TokenIssuer:
    return TokenIssuer(require_keys(keys, service))


def verifier(
    keys: KeySet | None, service: str, aud: str, leeway_s: float, revoked: Path | None = None
) -> TokenVerifier:
    """The service's token check; ``revoked``: its revocation file (ConfigError if bad)."""
    revocations = RevocationList(revoked) if revoked is not None else None
    return TokenVerifier(require_keys(keys, service), aud, leeway_s=leeway_s, revoked=revocations)
