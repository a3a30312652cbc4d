"""Address helpers shared by the services."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str | None) -> bool:
    """True for ``localhost`` and any loopback address (127.0.0.0/8, ::1)."""
    if not host:
        return False
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
