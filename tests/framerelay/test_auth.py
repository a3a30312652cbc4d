"""Standard tokens: signatures, audiences, time window, scopes, rotation by name."""

from __future__ import annotations

import json
import time

import jwt
import pytest

from framerelay.auth import (
    Forbidden,
    KeySet,
    TokenIssuer,
    TokenVerifier,
    Unauthorized,
    bearer_token,
)
from framerelay.auth.keys import generate
from framerelay.errors import ConfigError
from tests.support.auth import hs256_by_hand

NOW = 1_800_000_000.0


@pytest.fixture(params=["EdDSA", "ES256", "HS256"])
def keys(request: pytest.FixtureRequest) -> KeySet:
    return KeySet([generate(request.param, f"k-{request.param}")])


def _verifier(keys: KeySet, aud: str = "ingest", leeway: float = 30.0) -> TokenVerifier:
    public = keys if next(iter(keys)).symmetric else keys.public()
    return TokenVerifier(public, aud, leeway_s=leeway)


def test_valid_token_verifies_with_public_half(keys: KeySet) -> None:
    token = TokenIssuer(keys).mint("app-1", ["results:cam-1"], 60, aud="ingest", now=NOW)
    claims = _verifier(keys).verify(token, "results:cam-1", now=NOW + 30)
    assert (claims.sub, claims.scope, claims.aud) == (
        "app-1",
        ("results:cam-1",),
        "framerelay-ingest",
    )
    assert jwt.get_unverified_header(token)["kid"] == keys.kids[0]


@pytest.mark.parametrize(
    ("scope", "wanted", "ok"),
    [
        (["results:cam-1"], "results:cam-1", True),
        (["results:cam-1"], "results:cam-2", False),
        (["results:*"], "results:anything", True),
        (["streams:read"], "streams:write", False),
        (["streams:*"], "streams:write", True),
        (["worker:*"], "results:cam-1", False),
        (["results:*"], "results:", False),
    ],
)
def test_scopes(scope: list[str], wanted: str, ok: bool) -> None:
    keys = KeySet([generate("EdDSA", "a")])
    token = TokenIssuer(keys).mint("x", scope, 60, aud="ingest", now=NOW)
    if ok:
        _verifier(keys).verify(token, wanted, now=NOW)
    else:
        with pytest.raises(Forbidden, match="does not grant"):
            _verifier(keys).verify(token, wanted, now=NOW)


def _forge(claims: dict[str, object], key: object, alg: str, kid: str) -> str:
    return jwt.encode(claims, key, algorithm=alg, headers={"kid": kid})  # type: ignore[arg-type]


def _claims(**over: object) -> dict[str, object]:
    base: dict[str, object] = {"iss": "framerelay", "sub": "x", "aud": "framerelay-ingest",
                               "scope": "results:*", "iat": int(NOW), "nbf": int(NOW),
                               "exp": int(NOW) + 60}  # fmt: skip
    return {**base, **over}


def test_refusals_say_why() -> None:
    keys = KeySet([generate("EdDSA", "main")])
    other = KeySet([generate("EdDSA", "main")])  # same name, another key
    v = _verifier(keys, leeway=30)
    issuer = TokenIssuer(keys)
    cases = {
        "expired": issuer.mint("x", ["results:*"], 10, aud="ingest", now=NOW - 100),
        "not_yet_valid": issuer.mint("x", ["results:*"], 10, aud="ingest", now=NOW + 100),
        "wrong_audience": issuer.mint("x", ["results:*"], 60, aud="orchestrator", now=NOW),
        "bad_signature": TokenIssuer(other).mint("x", ["results:*"], 60, aud="ingest", now=NOW),
        "unknown_key": TokenIssuer(KeySet([generate("EdDSA", "gone")])).mint(
            "x", ["results:*"], 60, aud="ingest", now=NOW
        ),
        "malformed": "fr1.e30.c2ln",
    }
    for reason, token in cases.items():
        with pytest.raises(Unauthorized) as err:
            v.verify(token, "results:cam-1", now=NOW)
        assert err.value.reason == reason, (reason, str(err.value))
        assert err.value.status == 401
        assert token not in str(err.value)


def test_leeway_absorbs_clock_skew() -> None:
    keys = KeySet([generate("EdDSA", "a")])
    skewed = TokenIssuer(keys).mint("x", ["results:*"], 60, aud="ingest", now=NOW + 20)
    _verifier(keys, leeway=30).verify(skewed, "results:a", now=NOW)
    with pytest.raises(Unauthorized, match="not valid yet"):
        _verifier(keys, leeway=5).verify(skewed, "results:a", now=NOW)


def test_algorithm_confusion_and_alg_none_are_refused() -> None:
    keys = KeySet([generate("EdDSA", "ed")])
    public = keys.public()
    pub_bytes = json.dumps(next(iter(public)).public_jwk()).encode()
    confused = hs256_by_hand(_claims(), pub_bytes, {"kid": "ed"})
    # PyJWT types the key without None, the only key its "none" algorithm takes
    none = jwt.encode(_claims(), None, algorithm="none", headers={"kid": "ed"})  # type: ignore[arg-type]
    for token in (confused, none):
        with pytest.raises(Unauthorized, match="algorithm"):
            TokenVerifier(public, "ingest").verify(token, "results:a", now=NOW)


@pytest.mark.parametrize("missing", ["exp", "aud", "nbf", "sub", "scope"])
def test_required_claims(missing: str) -> None:
    keys = KeySet([generate("ES256", "es")])
    claims = _claims()
    del claims[missing]
    token = _forge(claims, next(iter(keys)).signing_key(), "ES256", "es")
    with pytest.raises(Unauthorized):
        _verifier(keys).verify(token, "results:a", now=NOW)


def test_public_keys_cannot_mint() -> None:
    keys = KeySet([generate("EdDSA", "a")])
    with pytest.raises(ConfigError, match="only public keys"):
        TokenIssuer(keys.public())


@pytest.mark.parametrize("order", ["old-first", "new-first"])
def test_rotation_by_name_in_any_order(order: str) -> None:
    old, new = generate("EdDSA", "2026-11"), generate("EdDSA", "2026-12")
    token = TokenIssuer(KeySet([old])).mint("app", ["results:*"], 60, aud="ingest", now=NOW)
    both = KeySet([old, new] if order == "old-first" else [new, old])
    _verifier(both).verify(token, "results:a", now=NOW)
    fresh = TokenIssuer(both).mint("app", ["results:*"], 60, aud="ingest", now=NOW)
    _verifier(both).verify(fresh, "results:a", now=NOW)
    with pytest.raises(Unauthorized, match="unknown key id '2026-11'") as err:
        _verifier(KeySet([new])).verify(token, "results:a", now=NOW)
    assert err.value.reason == "unknown_key"


def test_shared_secret_rotation_is_positional_no_more() -> None:
    """The quoted bug: a token signed with secrets [A] was refused once the list was [B, A]."""
    a, b = "a" * 32, "b" * 32
    token = TokenIssuer(KeySet.from_secrets([a])).mint("i", ["worker:w"], 60, aud="worker", now=NOW)
    TokenVerifier(KeySet.from_secrets([b, a]), "worker").verify(token, "worker:w", now=NOW)
    TokenVerifier(KeySet.from_secrets([a, b]), "worker").verify(token, "worker:w", now=NOW)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("not json", "not JSON"),
        ('{"keys": []}', "non-empty"),
        ('{"keys": [{"kty": "OKP"}]}', "kid"),
        ('{"keys": [{"kid": "a", "kty": "RSA"}]}', "not supported"),
        ('{"keys": [{"kid": "a", "kty": "OKP", "crv": "Ed25519", "x": "!!"}]}', "not a valid"),
        ('{"keys": [{"kid": "a", "kty": "oct", "k": "c2hvcnQ"}]}', "16 bytes"),
    ],
)
def test_bad_key_sets_are_config_errors(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        KeySet.from_json(text)


def test_duplicate_kid_and_short_secret() -> None:
    key = generate("EdDSA", "same")
    with pytest.raises(ConfigError, match="twice"):
        KeySet([key, key])
    with pytest.raises(ConfigError, match="shorter"):
        KeySet.from_secrets(["short"])


def test_reprs_hold_no_key_material() -> None:
    key = generate("EdDSA", "a")
    keys = KeySet([key])
    for text in (repr(key), repr(keys)):
        assert str(key.jwk["d"]) not in text


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), float("inf"), 1e12])
def test_bad_lifetimes(ttl: float) -> None:
    with pytest.raises(ConfigError, match="lifetime"):
        TokenIssuer(KeySet([generate("EdDSA")])).mint("x", ["results:*"], ttl, aud="ingest")


def test_huge_or_garbage_tokens() -> None:
    v = TokenVerifier(KeySet([generate("EdDSA", "a")]).public(), "ingest")
    for token in ("x" * 100_000, "a.b.c", "..", "\x00", "eyJ9.eyJ9.x"):
        with pytest.raises(Unauthorized):
            v.verify(token, "results:a")


@pytest.mark.parametrize(
    ("header", "ok"),
    [("Bearer abc", True), ("bearer abc", True), ("Basic abc", False), ("Bearer ", False),
     ("", False), (None, False)],
)  # fmt: skip
def test_bearer_header(header: str | None, ok: bool) -> None:
    if ok:
        assert bearer_token(header) == "abc"
    else:
        with pytest.raises(Unauthorized):
            bearer_token(header)


def test_real_clock_path() -> None:
    keys = KeySet([generate("EdDSA", "a")])
    token = TokenIssuer(keys).mint("x", ["results:*"], 60, aud="ingest")
    claims = _verifier(keys).verify(token, "results:a")
    assert abs(claims.iat - time.time()) < 5
