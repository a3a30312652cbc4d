"""Key sets (JWKS) for signing and verifying tokens.

A key set is a JSON Web Key Set (RFC 7517): ``{"keys": [{"kid": ..., ...}]}``.
Each key has a name (``kid``) and one algorithm:

* ``EdDSA`` (Ed25519, ``kty: OKP``) - the default: asymmetric, so whoever
  holds only the public half can verify tokens but never mint one;
* ``ES256`` (P-256, ``kty: EC``) - asymmetric too;
* ``HS256`` (``kty: oct``) - a shared secret, for a single host only: every
  holder can mint.

Tokens name their key in the ``kid`` header, so keys are found by name, never
by position: rotation is "add the new key, later remove the old", in any
order. A private set signs with its **first** key, so a key added at the end
is verify-only until the old one before it is removed.

Comma-separated ``FRAMERELAY_TOKEN_SECRETS`` (the single-host shorthand)
become HS256 keys named after a hash of each secret (``hs-<12 hex>``), so
they too keep their names when the list is reordered.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from jwt import PyJWK
from jwt.exceptions import InvalidKeyError, PyJWKError

from framerelay.errors import ConfigError

ALGORITHMS = ("EdDSA", "ES256", "HS256")
MIN_SECRET_BYTES = 16
MAX_KEYSET_BYTES = 1 << 20
_PRIVATE_MEMBERS = ("d", "p", "q", "dp", "dq", "qi", "k")
_DEFAULT_ALG = {"OKP": "EdDSA", "EC": "ES256", "oct": "HS256"}


@dataclass(frozen=True, slots=True)
class Key:
    """One named key: what it signs or verifies with, and its JWK."""

    kid: str
    alg: str
    jwk: Mapping[str, Any]
    """The JWK as given (private members included when it is a private key)."""

    @property
    def symmetric(self) -> bool:
        return self.alg == "HS256"

    @property
    def private(self) -> bool:
        return any(m in self.jwk for m in _PRIVATE_MEMBERS)

    def public_jwk(self) -> dict[str, Any]:
        """The JWK without private members (never for HS256: it has no public half)."""
        if self.symmetric:
            raise ConfigError(f"key {self.kid!r} is an HS256 secret: it has no public half")
        return {k: v for k, v in self.jwk.items() if k not in _PRIVATE_MEMBERS}

    def signing_key(self) -> Any:
        """The key object PyJWT signs with."""
        if not self.private:
            raise ConfigError(f"key {self.kid!r} is a public key: it can verify, not sign")
        return PyJWK(dict(self.jwk), self.alg).key

    def verifying_key(self) -> Any:
        """The key object PyJWT verifies with (the public half where there is one)."""
        jwk = dict(self.jwk) if self.symmetric else self.public_jwk()
        return PyJWK(jwk, self.alg).key

    def __repr__(self) -> str:  # never the key material
        kind = "private" if self.private else "public"
        return f"Key(kid={self.kid!r}, alg={self.alg!r}, {kind})"


class KeySet:
    """Keys by name; the first private key signs."""

    def __init__(self, keys: Iterable[Key]) -> None:
        self._keys: dict[str, Key] = {}
        for key in keys:
            if key.kid in self._keys:
                raise ConfigError(f"key id {key.kid!r} appears twice in the key set")
            self._keys[key.kid] = key

    def __iter__(self) -> Iterator[Key]:
        return iter(self._keys.values())

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"KeySet({list(self._keys)})"

    def get(self, kid: str) -> Key | None:
        return self._keys.get(kid)

    @property
    def kids(self) -> list[str]:
        return list(self._keys)

    def signer(self) -> Key:
        """The key new tokens are signed with: the first one that can sign."""
        for key in self._keys.values():
            if key.private:
                return key
        raise ConfigError(
            "no signing key: this key set holds only public keys (they verify, never sign); "
            "give the private key set (FRAMERELAY_SIGNING_KEYS_FILE)"
        )

    def merged(self, other: KeySet) -> KeySet:
        return KeySet([*self, *other])

    def public(self) -> KeySet:
        """The same set with public halves only (HS256 secrets left out)."""
        return KeySet(
            Key(k.kid, k.alg, k.public_jwk()) for k in self._keys.values() if not k.symmetric
        )

    def to_jwks(self) -> dict[str, Any]:
        return {"keys": [dict(k.jwk) for k in self._keys.values()]}

    def to_json(self) -> str:
        return json.dumps(self.to_jwks(), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, *, source: str = "the key set") -> KeySet:
        """Parse a JWKS document; ConfigError names what is wrong (never key material)."""
        if len(text) > MAX_KEYSET_BYTES:
            raise ConfigError(f"{source} is larger than {MAX_KEYSET_BYTES} bytes")
        try:
            doc = json.loads(text)
        except ValueError:
            raise ConfigError(
                f'{source} is not JSON; expected a JWKS ({{"keys": [...]}}), e.g. from '
                "'framerelay keys generate'"
            ) from None
        raw = doc.get("keys") if isinstance(doc, dict) else None
        if not isinstance(raw, list) or not raw:
            raise ConfigError(f'{source} must be a JWKS with a non-empty "keys" list')
        return cls(_key_from(item, source, i) for i, item in enumerate(raw))

    @classmethod
    def from_secrets(cls, values: Iterable[str]) -> KeySet:
        """HS256 keys from shared secrets (``FRAMERELAY_TOKEN_SECRETS``)."""
        keys = []
        for i, secret in enumerate(values):
            if len(secret.encode()) < MIN_SECRET_BYTES:
                raise ConfigError(
                    f"token secret #{i + 1} is shorter than {MIN_SECRET_BYTES} bytes; generate one "
                    "with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
                )
            keys.append(
                Key(secret_kid(secret), "HS256", {"kty": "oct", "k": _b64(secret.encode())})
            )
        return cls(keys)


def secret_kid(secret: str) -> str:
    """A stable name for a shared secret that reveals nothing usable about it."""
    return "hs-" + hashlib.sha256(b"framerelay-kid:" + secret.encode()).hexdigest()[:12]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _key_from(item: object, source: str, index: int) -> Key:
    where = f"{source}, key #{index + 1}"
    if not isinstance(item, dict):
        raise ConfigError(f"{where} is not a JSON object")
    kid = item.get("kid")
    if not isinstance(kid, str) or not 1 <= len(kid) <= 128:
        raise ConfigError(f'{where} needs a "kid" (its name, 1-128 characters)')
    alg = item.get("alg") or _DEFAULT_ALG.get(str(item.get("kty")), "")
    if alg not in ALGORITHMS:
        raise ConfigError(f"{where} ({kid!r}): algorithm {alg!r} not supported; use {ALGORITHMS}")
    if alg == "HS256" and len(_unb64(str(item.get("k", "")))) < MIN_SECRET_BYTES:
        raise ConfigError(f"{where} ({kid!r}): an HS256 secret needs >= {MIN_SECRET_BYTES} bytes")
    try:
        PyJWK(dict(item), alg)
    except (PyJWKError, InvalidKeyError, ValueError, TypeError, KeyError):
        raise ConfigError(f"{where} ({kid!r}) is not a valid {alg} JWK") from None
    return Key(kid, alg, dict(item, alg=alg))


def generate(alg: str = "EdDSA", kid: str | None = None) -> Key:
    """A new private key; its name defaults to ``<alg>-<date>-<random>``."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519
    from jwt.algorithms import ECAlgorithm, OKPAlgorithm

    name = kid or f"{alg.lower()}-{time.strftime('%Y%m%d')}-{secrets.token_hex(3)}"
    if alg == "EdDSA":
        jwk = json.loads(OKPAlgorithm.to_jwk(ed25519.Ed25519PrivateKey.generate()))
    elif alg == "ES256":
        jwk = json.loads(ECAlgorithm.to_jwk(ec.generate_private_key(ec.SECP256R1())))
    elif alg == "HS256":
        jwk = {"kty": "oct", "k": _b64(secrets.token_bytes(32))}
    else:
        raise ConfigError(f"algorithm {alg!r} not supported; use one of {ALGORITHMS}")
    return Key(name, alg, {**jwk, "kid": name, "alg": alg, "use": "sig"})
