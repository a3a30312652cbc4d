"""What the rigs need from their surroundings: the repository's sample media and
model, free ports, tokens, ffmpeg, and the one timing factor of slow machines."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterable
from pathlib import Path

from framerelay.auth import KeySet, TokenIssuer

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "samples" / "models" / "yolox_nano_416.onnx"
CLIP = ROOT / "samples" / "mot15" / "TUD-Stadtmitte" / "TUD-Stadtmitte.mp4"

TIMEOUT_FACTOR = float(os.environ.get("FRAMERELAY_TIMEOUT_FACTOR", "1.0"))
"""Scales every timing-sensitive wait (slow CI machines: 2-3), as in the tests."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mint(secret: str, scopes: Iterable[str] | str, aud: str, ttl: float = 60.0) -> str:
    """An HS256 token under the shared ``secret`` for audience ``aud``."""
    wanted = [scopes] if isinstance(scopes, str) else list(scopes)
    return TokenIssuer(KeySet.from_secrets([secret])).mint("test", wanted, ttl, aud=aud)


def ffmpeg(*args: str) -> None:
    """Run ffmpeg quietly (overwriting its output); raises if it fails."""
    subprocess.run(
        ["ffmpeg", "-hide_banner", "-loglevel", "error", "-nostdin", "-y", *args],
        check=True,
        timeout=120,
    )
