"""Signed, expiring, scoped tokens."""

from __future__ import annotations

import base64
import json

import pytest

from framerelay.auth import TokenSigner, bearer_token
from framerelay.errors import AuthError, ConfigError

SECRET = "s" * 32
OTHER = "o" * 32
NOW = 1_800_000_000.0


@pytest.fixture
def signer() -> TokenSigner:
    return TokenSigner([SECRET])


def test_valid_token_verifies(signer: TokenSigner) -> None:
    token = signer.mint("ingest-a", ["worker:gpu-1"], 60, now=NOW)
    claims = signer.verify(token, "worker:gpu-1", now=NOW + 30)
    assert claims.sub == "ingest-a"
    assert claims.scope == ("worker:gpu-1",)


@pytest.mark.parametrize(
    ("scope", "wanted", "ok"),
    [
        (["worker:gpu-1"], "worker:gpu-1", True),
        (["worker:gpu-1"], "worker:gpu-2", False),
        (["worker:*"], "worker:gpu-2", True),
        (["stream:*"], "worker:gpu-2", False),
        (["stream:cam-1", "stream:cam-2"], "stream:cam-2", True),
        (["stream:cam-1"], "stream:cam-10", False),
        (["worker:*"], "worker:", False),
    ],
)
def test_scopes(signer: TokenSigner, scope: list[str], wanted: str, ok: bool) -> None:
    token = signer.mint("x", scope, 60, now=NOW)
    if ok:
        signer.verify(token, wanted, now=NOW)
    else:
        with pytest.raises(AuthError, match="does not grant"):
            signer.verify(token, wanted, now=NOW)


def _tamper(token: str) -> str:
    prefix, body, sig = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=="))
    claims["scope"] = ["worker:*"]
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{prefix}.{body}.{sig}"


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda s: s.mint("x", ["worker:w"], 10, now=NOW - 100), "expired"),
        (lambda s: s.mint("x", ["worker:w"], 10, now=NOW + 100), "future"),
        (lambda s: TokenSigner([OTHER]).mint("x", ["worker:w"], 60, now=NOW), "signature"),
        (lambda s: TokenSigner({"k9": OTHER}).mint("x", ["worker:w"], 60, now=NOW), "unknown key"),
        (lambda s: _tamper(s.mint("x", ["worker:other"], 60, now=NOW)), "signature"),
        (lambda s: "garbage", "malformed"),
        (lambda s: "fr1.!!!.???", "malformed"),
        (lambda s: "fr1." + "a" * 5000 + ".b", "longer than"),
        (lambda s: "fr1.e30.AAAA", "claims need"),
    ],
)
def test_bad_tokens_are_refused(signer: TokenSigner, make: object, needle: str) -> None:
    token = make(signer)  # type: ignore[operator]
    with pytest.raises(AuthError, match=needle) as err:
        signer.verify(token, "worker:w", now=NOW)
    assert SECRET not in str(err.value)
    assert token not in str(err.value) or len(token) < 12


def test_key_rotation_accepts_old_and_new() -> None:
    old = TokenSigner({"2025": OTHER})
    both = TokenSigner({"2026": SECRET, "2025": OTHER})
    both.verify(old.mint("x", ["worker:w"], 60, now=NOW), "worker:w", now=NOW)
    both.verify(both.mint("x", ["worker:w"], 60, now=NOW), "worker:w", now=NOW)


@pytest.mark.parametrize("secrets", [[], ["short"]])
def test_weak_config_is_refused(secrets: list[str]) -> None:
    with pytest.raises(ConfigError):
        TokenSigner(secrets)


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("Bearer abc", True),
        ("bearer abc", True),
        (None, False),
        ("", False),
        ("Basic abc", False),
        ("Bearer ", False),
    ],
)
def test_bearer_header(header: str | None, ok: bool) -> None:
    if ok:
        assert bearer_token(header) == "abc"
    else:
        with pytest.raises(AuthError):
            bearer_token(header)
