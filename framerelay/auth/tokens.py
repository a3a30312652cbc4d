"""Standard tokens (JWT, RFC 7519) for every framerelay API.

A token is a JWS with the ``kid`` of its key in the header and these claims:

* ``iss`` ``"framerelay"``; ``sub`` who holds it (``ingest``, ``app-42``);
* ``aud`` the service that takes it: ``framerelay-ingest``,
  ``framerelay-orchestrator`` or ``framerelay-worker`` (the tunnel); a token
  for one service is refused by the others;
* ``scope`` space-separated (RFC 8693), each ``kind:what`` with ``kind:*``
  matching every ``what``: ``worker:gpu-a`` (open a tunnel to worker
  ``gpu-a``), ``results:cam-1`` / ``results:*``, ``streams:read``,
  ``streams:write``, ``routing:write``, ``fleet:read``, ``fleet:write``,
  ``jobs:read``, ``jobs:write``, ``metrics:read``;
* ``iat``, ``nbf``, ``exp`` (seconds), checked with a leeway for clock skew
  (default 30 s); ``jti`` a random id.

Any JWT library can mint and check them (PyJWT, ``jose`` in Node, ...) given
the key set. Error messages say which check failed and never contain a key
or the token.
"""

from __future__ import annotations

import math
import re
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import jwt
from jwt.exceptions import InvalidAudienceError, InvalidTokenError, MissingRequiredClaimError

from framerelay.auth.keys import KeySet
from framerelay.auth.revocation import RevocationList
from framerelay.errors import AuthError, ConfigError

ISSUER = "framerelay"
AUD_INGEST = "framerelay-ingest"
AUD_ORCHESTRATOR = "framerelay-orchestrator"
AUD_WORKER = "framerelay-worker"
AUDIENCES = {"ingest": AUD_INGEST, "orchestrator": AUD_ORCHESTRATOR, "worker": AUD_WORKER}
MAX_TOKEN_LEN = 8192
WORKER_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""One worker's name (a host or pod name): letters, digits and ``._-``, 1-128 characters,
starting with a letter or digit. Never ``*`` or a pattern: tunnel tokens are minted from it."""
_WORKER_ID_RE = re.compile(WORKER_ID)
MAX_TTL_S = 366 * 86_400.0
DEFAULT_LEEWAY_S = 30.0
_REQUIRED = ("exp", "iat", "nbf", "aud", "sub", "scope")


class Unauthorized(AuthError):
    """401: no token, or one that is malformed, badly signed, expired or for another service."""

    status = 401

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class Forbidden(AuthError):
    """403: a valid token that does not grant what was asked."""

    status = 403
    reason = "scope"


def audience(name: str) -> str:
    """``ingest`` -> ``framerelay-ingest``; full names pass through."""
    if name in AUDIENCES.values():
        return name
    if name not in AUDIENCES:
        raise ConfigError(f"unknown audience {name!r}; use one of {sorted(AUDIENCES)}")
    return AUDIENCES[name]


def grants(scopes: Iterable[str], wanted: str) -> bool:
    """True if one of ``scopes`` grants ``wanted`` (``kind:what``; ``kind:*`` = any)."""
    kind, _, what = wanted.partition(":")
    return bool(what) and any(s == wanted or s == f"{kind}:*" for s in scopes)


def worker_scope(worker_id: str) -> str:
    """The scope of a tunnel token for one worker, ``worker:<id>``; ConfigError when
    ``worker_id`` is not one worker's name (``*``, a pattern, a space, ...), so that no
    request can turn a narrow right into a token every worker accepts."""
    if _WORKER_ID_RE.fullmatch(worker_id) is None:
        shown = worker_id if len(worker_id) <= 40 else worker_id[:40] + "..."
        raise ConfigError(
            f"worker id {shown!r} is not one worker's name: expected 1-128 letters, digits "
            "or ._- starting with a letter or digit"
        )
    return f"worker:{worker_id}"


@dataclass(frozen=True, slots=True)
class Claims:
    """What a verified token says."""

    sub: str
    scope: tuple[str, ...]
    aud: str
    iat: int
    nbf: int
    exp: int
    kid: str
    jti: str = ""
    """The token's own id (``jti``), by which it can be revoked ("" when it has none)."""

    def allows(self, wanted: str) -> bool:
        return grants(self.scope, wanted)

    def require(self, wanted: str) -> None:
        if not self.allows(wanted):
            raise Forbidden(
                f"token for {self.sub!r} does not grant {wanted!r} (it grants {list(self.scope)})"
            )


class TokenIssuer:
    """Mints tokens with the first private key of a key set."""

    def __init__(self, keys: KeySet) -> None:
        self._key = keys.signer()

    @property
    def kid(self) -> str:
        return self._key.kid

    def mint(
        self,
        sub: str,
        scope: Iterable[str],
        ttl_s: float,
        *,
        aud: str,
        now: float | None = None,
    ) -> str:
        """A token for ``sub`` granting ``scope`` to service ``aud`` for ``ttl_s`` seconds."""
        if not (math.isfinite(ttl_s) and 0 < ttl_s <= MAX_TTL_S):
            raise ConfigError(f"token lifetime must be > 0 and at most {MAX_TTL_S:.0f} s")
        scopes = list(scope)
        if not scopes or any(not s or " " in s for s in scopes):
            raise ConfigError("a token needs at least one scope, each without spaces")
        t = time.time() if now is None else now
        issued = int(t)
        claims = {
            "iss": ISSUER,
            "sub": sub,
            "aud": audience(aud),
            "scope": " ".join(scopes),
            "iat": issued,
            "nbf": issued,
            "exp": math.ceil(t + ttl_s),  # at least ttl_s from now, though iat is floored
            "jti": secrets.token_hex(8),
        }
        key = self._key
        return jwt.encode(
            claims, key.signing_key(), algorithm=key.alg, headers={"kid": key.kid, "typ": "JWT"}
        )


class TokenVerifier:
    """Checks tokens for one audience against a key set (public halves suffice)."""

    def __init__(
        self,
        keys: KeySet,
        aud: str,
        *,
        leeway_s: float = DEFAULT_LEEWAY_S,
        revoked: RevocationList | None = None,
    ) -> None:
        if not len(keys):
            raise ConfigError("no verification keys configured")
        if not (math.isfinite(leeway_s) and 0 <= leeway_s <= 3600):
            raise ConfigError("token leeway must be between 0 and 3600 s")
        self.keys = keys
        self.audience = audience(aud)
        self.leeway_s = leeway_s
        self.revoked = revoked

    def verify(self, token: str, required_scope: str | None, *, now: float | None = None) -> Claims:
        """Signature, audience, revocation, time window, scope; :class:`Unauthorized` or
        :class:`Forbidden`."""
        claims = self._decode(token)
        why = self.revoked.reason(claims.jti, claims.sub) if self.revoked is not None else None
        if why is not None:
            raise Unauthorized(f"token for {claims.sub!r} was revoked: {why}", "revoked")
        t = time.time() if now is None else now
        if claims.exp + self.leeway_s <= t:
            raise Unauthorized(
                f"token for {claims.sub!r} expired {int(t - claims.exp)} s ago; mint a new one",
                "expired",
            )
        if claims.nbf - self.leeway_s > t or claims.iat - self.leeway_s > t:
            raise Unauthorized(
                "token is not valid yet (nbf/iat in the future); check the clocks of the "
                "issuer and this server",
                "not_yet_valid",
            )
        if required_scope is not None:
            claims.require(required_scope)
        return claims

    def _decode(self, token: str) -> Claims:
        if not token or len(token) > MAX_TOKEN_LEN:
            raise Unauthorized(
                f"token empty or longer than {MAX_TOKEN_LEN} characters", "malformed"
            )
        try:
            header = jwt.get_unverified_header(token)
        except InvalidTokenError:
            raise Unauthorized("malformed token: expected a JWT (header.claims.signature)",
                               "malformed") from None  # fmt: skip
        kid = header.get("kid")
        key = self.keys.get(kid) if isinstance(kid, str) else None
        if key is None:
            raise Unauthorized(
                f"token signed with unknown key id {str(kid)[:64]!r} (removed, or never listed "
                "in this service's key set)",
                "unknown_key",
            )
        try:
            raw = jwt.decode(
                token, key.verifying_key(), algorithms=[key.alg], audience=self.audience,
                issuer=ISSUER, options={"require": list(_REQUIRED), "verify_exp": False,
                                        "verify_nbf": False, "verify_iat": False},
            )  # fmt: skip
        except InvalidAudienceError:
            raise Unauthorized(f"token is not for this service (audience {self.audience!r})",
                               "wrong_audience") from None  # fmt: skip
        except MissingRequiredClaimError as exc:
            raise Unauthorized(
                f"malformed token: claim {exc.claim!r} missing", "malformed"
            ) from None
        except InvalidTokenError as exc:
            raise Unauthorized(_why(exc, key.alg), "bad_signature") from None
        return _claims(raw, key.kid)


class SessionToken:
    """The token of a long-lived session (a results WebSocket, an event stream): verified
    again at most every ``every_s`` while the session runs, so that a token revoked (or
    whose key was removed) ends its session within seconds rather than at its expiry."""

    def __init__(
        self,
        verifier: TokenVerifier,
        token: str,
        *,
        every_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._verifier = verifier
        self._token = token
        self.every_s = every_s
        self._clock = clock
        self._checked_at = clock()

    def __repr__(self) -> str:  # never the token
        return f"SessionToken(every_s={self.every_s})"

    def refused(self) -> Unauthorized | None:
        """Why the token no longer verifies, expiry aside (the session keeps its own
        deadline); None while it does or until ``every_s`` has passed."""
        now = self._clock()
        if now - self._checked_at < self.every_s:
            return None
        self._checked_at = now
        try:
            self._verifier.verify(self._token, None)
        except Unauthorized as exc:
            return None if exc.reason == "expired" else exc
        return None


def _why(exc: InvalidTokenError, alg: str) -> str:
    name = type(exc).__name__
    if name == "InvalidSignatureError":
        return "token signature does not match (wrong key or tampered token)"
    if name == "InvalidAlgorithmError":
        return f"token algorithm does not match its key (the key is {alg})"
    if name == "InvalidIssuerError":
        return f"token issuer is not {ISSUER!r}"
    return f"invalid token ({name})"


def _claims(raw: dict[str, Any], kid: str) -> Claims:
    scope = raw.get("scope")
    scopes = scope.split() if isinstance(scope, str) else scope
    aud = raw.get("aud")
    try:
        if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
            raise TypeError
        return Claims(
            sub=str(raw["sub"]), scope=tuple(scopes),
            aud=aud if isinstance(aud, str) else ",".join(map(str, aud or ())),
            iat=int(raw["iat"]), nbf=int(raw["nbf"]), exp=int(raw["exp"]), kid=kid,
            jti=str(raw.get("jti", "")),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError, OverflowError):
        raise Unauthorized(
            "malformed token: scope must be a space-separated string; iat/nbf/exp numbers",
            "malformed",
        ) from None


def bearer_token(header_value: str | None) -> str:
    """The token of an ``Authorization: Bearer ...`` header."""
    if not header_value:
        raise Unauthorized(
            "missing Authorization header; send 'Authorization: Bearer <token>'", "missing"
        )
    scheme, _, token = header_value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Authorization header must be 'Bearer <token>'", "malformed")
    return token.strip()
