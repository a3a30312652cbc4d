"""What a stolen pod holds, and every token it could make from it.

:func:`harvest` reads a process as an attacker with a shell in its pod would:
its environment, its argv, every file those name or it has open, and the
tokens in its memory (a pod receives tunnel and canary tokens). :func:`forge`
turns each harvested value into signers: HS256 with the raw bytes, with any
JWK ``k`` (and, algorithm confusion, with public members and PEM public
keys), the private key of any PEM or JWK (ES256, EdDSA, RS256), and
``alg: none``; each under every key id of the public set and its own.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt import PyJWK

from framerelay.auth.keys import secret_kid
from framerelay.auth.tokens import AUD_INGEST, AUD_ORCHESTRATOR, AUD_WORKER
from tests.support.auth import b64url, hs256_by_hand

AUDIENCES = (AUD_INGEST, AUD_ORCHESTRATOR, AUD_WORKER)
EVERY_SCOPE = "streams:* routing:* results:* fleet:* worker:* metrics:*"
JWT = re.compile(rb"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{16,}")
PEM = re.compile(rb"-----BEGIN ([A-Z ]+)-----[A-Za-z0-9+/=\s]+-----END \1-----")
MAX_FILE = 64 << 20
Sign = Callable[[dict[str, Any]], str]


@dataclass
class Loot:
    """Everything a pod holds, by where it was found."""

    blobs: dict[str, bytes] = field(default_factory=dict)
    tokens: set[str] = field(default_factory=set)

    def add(self, label: str, data: bytes) -> None:
        if data and data not in self.blobs.values():
            self.blobs[label] = data
        self.tokens.update(m.decode() for m in JWT.findall(data))

    def text(self) -> bytes:
        return b"\n".join(self.blobs.values())


def harvest(pid: int) -> Loot:
    proc = Path(f"/proc/{pid}")
    loot = Loot()
    env = [e for e in (proc / "environ").read_bytes().split(b"\0") if e]
    argv = [a for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
    values = [e.partition(b"=")[2] for e in env] + argv
    for i, value in enumerate(values):
        loot.add(f"value {i}", value)
    named = {Path(p.decode()) for v in values for p in v.split(os.pathsep.encode()) if p}
    named |= {p for fd in (proc / "fd").iterdir() if (p := _link(fd)) is not None}
    for path in sorted(named):
        with contextlib.suppress(OSError, ValueError):
            if path.is_file() and path.stat().st_size <= MAX_FILE:
                loot.add(f"file {path}", path.read_bytes())
    loot.tokens |= memory_tokens(pid)
    return loot


def _link(fd: Path) -> Path | None:
    with contextlib.suppress(OSError):
        target = os.readlink(fd)
        if target.startswith("/"):
            return Path(target)
    return None


def memory_tokens(pid: int) -> set[str]:
    """JWTs in the writable memory of ``pid`` (what it received: tunnel, canary tokens)."""
    found: set[str] = set()
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("rw"):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            with contextlib.suppress(OSError, OverflowError, ValueError):
                mem.seek(start)
                found.update(m.decode() for m in JWT.findall(mem.read(end - start)))
    return found


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hs256(secret: bytes, kid: str) -> Sign:
    """HS256 by hand: PyJWT rightly refuses to HMAC with PEM-looking keys."""

    def sign(claims: dict[str, Any]) -> str:
        return hs256_by_hand(claims, secret, {"kid": kid, "typ": "JWT"})

    return sign


def unsigned(kid: str) -> Sign:
    def sign(claims: dict[str, Any]) -> str:
        head = b64url(json.dumps({"alg": "none", "kid": kid, "typ": "JWT"}).encode())
        return f"{head}.{b64url(json.dumps(claims).encode())}."

    return sign


def with_key(key: Any, alg: str, kid: str) -> Sign:
    return lambda claims: jwt.encode(claims, key, algorithm=alg, headers={"kid": kid})


def _alg_of(key: Any) -> str | None:
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return "EdDSA"
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return {256: "ES256", 384: "ES384", 521: "ES512"}.get(key.curve.key_size)
    if isinstance(key, rsa.RSAPrivateKey):
        return "RS256"
    return None


def _pem_signers(data: bytes, kids: list[str]) -> dict[str, Sign]:
    out: dict[str, Sign] = {}
    for i, match in enumerate(PEM.finditer(data)):
        block, kind = match.group(0), match.group(1).decode()
        with contextlib.suppress(ValueError, TypeError):
            if kind.endswith("PRIVATE KEY"):
                key = serialization.load_pem_private_key(block, None)
                alg = _alg_of(key)
                for kid in kids if alg else []:
                    out[f"pem {i} {alg} kid {kid}"] = with_key(key, alg or "", kid)
            elif kind == "CERTIFICATE":
                public = x509.load_pem_x509_certificate(block).public_key()
                spki = public.public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                )
                for kid in kids:
                    out[f"cert {i} public key as hs256 kid {kid}"] = hs256(spki, kid)
    return out


def _jwk_signers(data: bytes, kids: list[str]) -> dict[str, Sign]:
    try:
        doc = json.loads(data)
    except ValueError:
        return {}
    items = doc.get("keys", [doc]) if isinstance(doc, dict) else []
    out: dict[str, Sign] = {}
    for i, jwk in enumerate(j for j in items if isinstance(j, dict)):
        names = [*kids, str(jwk.get("kid", ""))]
        for member in ("k", "x", "y", "d"):
            if isinstance(jwk.get(member), str):
                raw = _unb64(jwk[member])
                out |= {f"jwk {i} {member} hs256 kid {k}": hs256(raw, k) for k in names}
        out |= {f"jwk {i} json hs256 kid {k}": hs256(json.dumps(jwk).encode(), k) for k in names}
        if "d" in jwk:  # a private key: sign with it
            with contextlib.suppress(Exception):
                key = PyJWK(dict(jwk))
                out |= {f"jwk {i} private kid {k}": with_key(key.key, key.algorithm_name, k)
                        for k in names}  # fmt: skip
    return out


def signers(loot: Loot, kids: Iterable[str]) -> dict[str, Sign]:
    """Every way to sign a token with what ``loot`` holds, under ``kids`` and its own ids."""
    known = list(dict.fromkeys(kids))
    out: dict[str, Sign] = {f"alg none kid {k}": unsigned(k) for k in known}
    for label, data in loot.blobs.items():
        text = data.decode(errors="replace").strip()
        own = [*known, secret_kid(text)]
        for kid in own:
            out[f"{label}: hs256 raw kid {kid}"] = hs256(data, kid)
            if text.encode() != data:
                out[f"{label}: hs256 stripped kid {kid}"] = hs256(text.encode(), kid)
        out |= {f"{label}: {k}": s for k, s in _pem_signers(data, [*known, "pod"]).items()}
        out |= {f"{label}: {k}": s for k, s in _jwk_signers(data, known).items()}
    return out


def claims(aud: str | list[str], sub: str = "stolen-pod") -> dict[str, Any]:
    """A token that grants everything to ``aud`` (one audience or all of them)."""
    now = int(time.time())
    return {
        "iss": "framerelay", "sub": sub, "aud": aud, "scope": EVERY_SCOPE,
        "iat": now - 5, "nbf": now - 5, "exp": now + 600, "jti": secrets.token_hex(8),
    }  # fmt: skip


def _about(token: str) -> str:
    with contextlib.suppress(jwt.PyJWTError):
        seen = jwt.decode(token, options={"verify_signature": False})
        return f"aud {seen.get('aud')}, scope {seen.get('scope')}"
    return "undecodable"


def forge(loot: Loot, kids: Iterable[str]) -> list[tuple[str, str, str | None]]:
    """``(how, token, audience or None for every audience)``: each signer once for all
    audiences at once and once per audience; then every token found, replayed."""
    out: list[tuple[str, str, str | None]] = []
    for how, sign in signers(loot, kids).items():
        out.append((how, sign(claims(list(AUDIENCES))), None))
        out += [(how, sign(claims(aud)), aud) for aud in AUDIENCES]
    out += [
        (f"replayed token {i} ({_about(t)})", t, None) for i, t in enumerate(sorted(loot.tokens))
    ]
    return out
