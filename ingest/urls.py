"""Stream and orchestrator URLs: what a stream's source may be and where the ingest may
read the orchestrator (redaction for views and logs: :mod:`framerelay.redact`)."""

from __future__ import annotations

from urllib.parse import urlsplit

from framerelay.net import is_loopback

URL_SCHEMES = (
    "rtsp", "rtsps", "rtmp", "rtmps", "http", "https", "srt", "udp", "tcp", "rtp", "ftp", "file",
)  # fmt: skip
"""Network schemes a stream URL may use (anything else is a file path, without ``://``)."""


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a stream's source, without echoing it (it may hold a password)."""
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        return "contains a control character (a newline or tab?)"
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None  # a file path
    if scheme.lower() not in URL_SCHEMES:
        shown = scheme if len(scheme) <= 16 and scheme.isascii() else scheme[:16] + "..."
        return (f"unknown scheme {shown!r}: use {', '.join(s + '://' for s in URL_SCHEMES)} or "
                "a file path")  # fmt: skip
    host = rest.split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
    if scheme.lower() != "file" and not host:
        return f"no host after {scheme}://"
    return None


ORCHESTRATOR_TOKEN_ENV = "FRAMERELAY_INGEST_ORCHESTRATOR_TOKEN"  # noqa: S105 - a name


def orchestrator_url_problem(url: str) -> str | None:
    """Why the ingest must not read the orchestrator API at ``url`` (None: it may), without
    echoing the URL. ``https://`` always; plain ``http://`` only to this host (loopback)."""
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        return "contains a control character (a newline or tab?)"
    try:
        parts = urlsplit(url)
        host, _ = parts.hostname or "", parts.port
    except ValueError:
        return "not a valid URL; expected https://host[:port]"
    if parts.scheme not in ("http", "https") or not host:
        return "must be https://host[:port] (http:// only to this host)"
    if "@" in parts.netloc:
        return f"must not hold credentials (user:password@): set {ORCHESTRATOR_TOKEN_ENV}"
    if parts.query or parts.fragment:
        return "must not have a query or fragment; expected https://host[:port][/path]"
    if parts.scheme == "http" and not is_loopback(host):
        return (f"refusing plain http:// to orchestrator host {host!r}: its token would cross "
                "the network unencrypted; use https:// (verified with "
                "FRAMERELAY_INGEST_ORCHESTRATOR_CA, else the system's CAs)")  # fmt: skip
    return None
