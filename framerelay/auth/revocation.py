"""Revoked tokens: a file an operator edits, read again whenever it changes.

Rotating a key refuses every token it signed; revocation refuses one token, or every
token of one holder, at once and without a restart. The file
(``FRAMERELAY_REVOKED_TOKENS_FILE``) holds one entry a line::

    # a leaked app token (its jti, from 'framerelay token inspect')
    jti:3f9c2a7d1b004e6a
    # every token minted for this holder, whatever its expiry
    sub:lobby-app

Blank lines and ``#`` comments are ignored; anything else is a :class:`ConfigError`
naming the line (at start), or, when an edit breaks a file that was read before, a
warning with the previous list kept (a typo never reopens what was revoked). The file
is looked at again at most every ``check_s`` seconds (its size and modification time;
read again only when they changed), so a verification costs a clock read and a set
lookup. ``framerelay token revoke`` appends entries. Long-lived sessions (the results
WebSocket, the console's event stream) check their token again while they run, so a
revoked token's session ends within seconds, not at its expiry.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from framerelay.errors import ConfigError

log = logging.getLogger(__name__)
MAX_FILE_BYTES = 1 << 20
KINDS = ("jti", "sub")
ENV = "FRAMERELAY_REVOKED_TOKENS_FILE"
DEFAULT_CHECK_S = 1.0


def parse(text: str, source: str) -> frozenset[str]:
    """The entries of a revocation file (``kind:value``); ConfigError naming a bad line."""
    found: set[str] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        kind, sep, value = line.partition(":")
        if not sep or kind not in KINDS or not value.strip() or " " in value.strip():
            raise ConfigError(
                f"{source} line {number}: expected jti:<token id> or sub:<holder>, got "
                f"{line[:60]!r}"
            )
        found.add(f"{kind}:{value.strip()}")
    return frozenset(found)


class RevocationList:
    """``reason(jti, sub)``: why a token is revoked (None: it is not)."""

    def __init__(
        self,
        path: Path,
        *,
        check_s: float = DEFAULT_CHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.check_s = check_s
        self._clock = clock
        self._stamp: tuple[int, int] | None = None
        self._checked_at = clock()
        self.entries = self._read(strict=True)

    def reason(self, jti: str, sub: str) -> str | None:
        self._refresh()
        if f"jti:{jti}" in self.entries:
            return "its id is revoked"
        if f"sub:{sub}" in self.entries:
            return f"every token of {sub!r} is revoked"
        return None

    def _refresh(self) -> None:
        now = self._clock()
        if now - self._checked_at < self.check_s:
            return
        self._checked_at = now
        self.entries = self._read(strict=False)

    def _stat(self) -> tuple[int, int]:
        st = os.stat(self.path)
        return st.st_mtime_ns, st.st_size

    def _read(self, *, strict: bool) -> frozenset[str]:
        """The file's entries; when not ``strict``, the ones held when it is unchanged or
        unreadable (a warning says why)."""
        source = f"{ENV} ({self.path})"
        try:
            stamp = self._stat()
            if not strict and stamp == self._stamp:
                return self.entries
            if stamp[1] > MAX_FILE_BYTES:
                raise ConfigError(f"{source} is larger than {MAX_FILE_BYTES} bytes")
            entries = parse(self.path.read_text(encoding="utf-8"), source)
        except (OSError, UnicodeDecodeError, ConfigError) as exc:
            why = exc if isinstance(exc, ConfigError) else f"{source}: cannot read it ({exc})"
            if strict:
                raise ConfigError(str(why)) from None
            log.warning("%s; keeping the %d revocations read before", why, len(self.entries))
            return self.entries
        self._stamp = stamp
        return entries
