"""Planted secrets, where to look for them (raw, URL- and base64-encoded), and a
private redis-server with a password."""

from __future__ import annotations

import base64
import contextlib
import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import httpx

from framerelay.auth import KeySet
from tests.conftest import TIMEOUT_FACTOR
from tests.support.auth import ed_keys
from tests.support.servers import free_port, wait_port


@dataclass
class Secrets:
    keys: KeySet = field(default_factory=lambda: ed_keys("leak-test"))
    hs: str = field(default_factory=lambda: "hs" + secrets.token_urlsafe(24))
    runpod: str = field(default_factory=lambda: "rpa_" + secrets.token_hex(16))
    redis: str = field(default_factory=lambda: "rds" + secrets.token_hex(12))
    camera: str = field(default_factory=lambda: "cam" + secrets.token_hex(12))

    @property
    def d(self) -> str:
        return str(next(iter(self.keys)).jwk["d"])

    def named(self) -> dict[str, str]:
        return {"signing key d": self.d, "token secret": self.hs, "runpod key": self.runpod,
                "redis password": self.redis, "camera password": self.camera}  # fmt: skip


def _b64_cores(data: bytes) -> list[str]:
    """What ``data`` looks like base64-encoded anywhere in a longer text (any alignment)."""
    out = []
    for shift in range(3):
        for enc in (base64.b64encode, base64.urlsafe_b64encode):
            text = enc(b"\0" * shift + data).decode().rstrip("=")
            out.append(text[4:-4])
    return out


def forms(secret: str) -> set[str]:
    out = {secret, quote(secret, safe=""), *_b64_cores(secret.encode())}
    with contextlib.suppress(ValueError):  # a base64url key: also its raw bytes' encodings
        raw = base64.urlsafe_b64decode(secret + "=" * (-len(secret) % 4))
        out |= {raw.hex(), base64.b64encode(raw).decode().rstrip("=")}
    return {f for f in out if len(f) >= 12}


@dataclass
class Evidence:
    items: list[tuple[str, str]] = field(default_factory=list)

    def add(self, where: str, text: str | bytes) -> None:
        self.items.append((where, text if isinstance(text, str) else text.decode(errors="replace")))

    def response(self, where: str, resp: httpx.Response) -> httpx.Response:
        self.add(f"{where} -> {resp.status_code}", f"{resp.headers}\n{resp.text}")
        return resp

    def found(self, named: dict[str, str]) -> list[str]:
        """``name in where: ...context...`` for every secret form found."""
        hits = []
        for name, secret in named.items():
            for f in forms(secret):
                for where, text in self.items:
                    if (at := text.find(f)) >= 0:
                        hits.append(f"{name} in {where}: {text[max(0, at - 80) : at + 40]!r}")
        return hits


def redis_with_password(folder: Path, password: str) -> tuple[subprocess.Popen[bytes], int]:
    """A private redis-server with a password (from a 0600 config file, not argv)."""
    port = free_port()
    conf = folder / "redis.conf"
    conf.write_text(f"bind 127.0.0.1\nport {port}\nrequirepass {password}\nsave \"\"\n"
                    f"appendonly no\ndir {folder}\nlogfile {folder / 'redis.log'}\n")  # fmt: skip
    conf.chmod(0o600)
    proc = subprocess.Popen(["redis-server", str(conf)])
    wait_port(port, 10 * TIMEOUT_FACTOR)
    return proc, port
