"""Stream and orchestrator URLs: what a stream's source may be and where the ingest may
read the orchestrator (redaction for views and logs: :mod:`framerelay.redact`)."""

from __future__ import annotations

from urllib.parse import urlsplit

from framerelay.net import is_loopback

PROTOCOLS: dict[str, str] = {
    "rtsp": "tcp,tls,udp,rtp,srtp",
    "rtsps": "tcp,tls,udp,rtp,srtp",
    "rtmp": "rtmp,rtmps,tcp,tls",
    "rtmps": "rtmp,rtmps,tcp,tls",
    "http": "http,https,tcp,tls,crypto",
    "https": "http,https,tcp,tls,crypto",
    "udp": "udp",
    "rtp": "rtp,udp",
}
"""Scheme a stream's source may use -> FFmpeg's ``protocol_whitelist`` for opening it: every
protocol its open may reach, nested ones too (RTP under RTSP, HLS segments and keys under
HTTP), so a playlist or redirect cannot switch to ``file``, ``concat``, ``gopher``..."""
FILE_PROTOCOLS = "file"
"""FFmpeg's ``protocol_whitelist`` for a local file (a playlist in it reaches no network)."""
URL_SCHEMES = tuple(PROTOCOLS)
"""Network schemes a stream's source may use; anything else is refused, a file is a path."""
UNSUPPORTED = {"srt": "PyAV's FFmpeg has no SRT: relay it as rtsp:// or udp://"}
FFMPEG_PROTOCOLS = frozenset(
    "async bluray cache concat concatf crypto data fd file ftp gopher gophers hls httpproxy "
    "icecast ipfs ipns md5 mmsh mmst pipe prompeg rtmpe rtmpt rtmpte rtmpts sctp srt srtp "
    "subfile tcp tee tls udplite unix zmq".split()
)
"""Names that are safe to repeat in an error (other text before a ``:`` may be a credential)."""


def source_scheme(url: str) -> str:
    """The scheme FFmpeg reads ``url`` with, lower-cased; ``""`` for a plain file path.

    FFmpeg takes any ``word:`` prefix as a protocol (``gopher:host/x``, ``pipe:0``,
    ``concat:a|b``), so does this: text before the first ``:`` that holds no ``/`` is a
    scheme, whatever follows. A path starting with ``/`` or ``./``, one without ``:``
    before its first ``/``, or a Windows drive (``C:/``) is a file; ``file:`` is FFmpeg's
    file protocol (see :func:`local_path`).
    """
    if url.startswith(("/", "./", "../")):
        return ""
    head, sep, rest = url.partition(":")
    if not sep or "/" in head:
        return ""
    if len(head) == 1 and head.isalpha() and rest[:1] in ("/", "\\"):
        return ""
    return head.lower()


def local_path(url: str) -> str | None:
    """The path FFmpeg's file protocol opens for ``url`` (None: not a local file)."""
    scheme = source_scheme(url)
    if scheme == "file":
        return url[len("file:") :]
    return url if scheme == "" else None


def protocols_for(url: str) -> str:
    """FFmpeg's ``protocol_whitelist`` for opening ``url`` (a file's for anything unknown)."""
    return PROTOCOLS.get(source_scheme(url), FILE_PROTOCOLS)


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a stream's source, without echoing it (it may hold a password)."""
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        return "contains a control character (a newline or tab?)"
    scheme = source_scheme(url)
    path = local_path(url)
    if path is not None:
        return None if path else "the file path is empty"
    if scheme not in PROTOCOLS:
        return _scheme_refused(scheme)
    if not url[len(scheme) :].startswith("://"):
        return f"write {scheme}://host/... (FFmpeg's {scheme}: form without // is refused)"
    try:
        parts = urlsplit(url)
        host, _ = parts.hostname, parts.port
    except ValueError:
        return f"not a valid {scheme}:// URL (check the host and the port)"
    if not host:
        return f"no host after {scheme}://"
    return None


def _scheme_refused(scheme: str) -> str:
    use = ", ".join(s + "://" for s in URL_SCHEMES)
    if scheme in UNSUPPORTED:
        return f"scheme {scheme!r} is not supported: {UNSUPPORTED[scheme]}"
    shown = f"scheme {scheme!r}" if scheme in FFMPEG_PROTOCOLS else "an unknown scheme"
    return f"{shown} is not allowed for a stream source: use {use} or a file path (/... or ./...)"


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
