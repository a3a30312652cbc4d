"""The FFmpeg options a stream's definition may set (``StreamConfig.options``).

``av.open`` hands every option to FFmpeg's demuxer and protocols, and many of
them change what the ingest sends or opens: ``method``, ``post_data`` and
``headers`` with CR/LF make an HTTP source any request; ``protocol_whitelist``
undoes the source's allowlist (:data:`ingest.urls.PROTOCOLS`); ``http_proxy``
sends it elsewhere; ``ca_file`` and ``key_file`` read local files; ``listen``
makes it a server. So options are an allowlist (:data:`ALLOWED_OPTIONS`) of
demuxer and protocol keys that only tune how a source is read (buffers,
timeouts, probing, transports, reconnects), each with the values it may take;
anything else is refused, naming the key. Values never hold a control
character. ``headers`` is one ``Name: value`` line (a camera or CDN that wants
a key header), never one that frames the request (``Host``,
``Content-Length``...).
"""

from __future__ import annotations

import re
from collections.abc import Callable

Check = Callable[[str], bool]
"""Whether a value is one the option may take."""

MAX_VALUE_CHARS = 1024
_INT = re.compile(r"-?[0-9]{1,19}")
_HEADER = re.compile(r"([A-Za-z0-9-]{1,64}):[ \t]*([^\r\n]*)")
FRAMING_HEADERS = frozenset(
    "host content-length transfer-encoding connection expect upgrade te trailer keep-alive "
    "proxy-authorization proxy-connection content-type".split()
)
"""Headers that decide where and how the request goes: never set by a definition."""


def _integer(value: str) -> bool:
    return _INT.fullmatch(value) is not None


def _boolean(value: str) -> bool:
    return value in ("0", "1")


def _flags(*names: str) -> Check:
    """A ``+``-joined set of ``names`` (``prefer_tcp``, ``+nobuffer+genpts``, ``-igndts``)."""
    allowed = frozenset(names)

    def check(value: str) -> bool:
        parts = re.split(r"[+-]", value.lstrip("+-")) if value else [""]
        return all(part in allowed for part in parts)

    return check


def _text(value: str) -> bool:
    return bool(value)


def _header(value: str) -> bool:
    match = _HEADER.fullmatch(value)
    return match is not None and match.group(1).lower() not in FRAMING_HEADERS


ALLOWED_OPTIONS: dict[str, Check] = {
    # probing and demuxing (any source)
    "analyzeduration": _integer,
    "probesize": _integer,
    "fpsprobesize": _integer,
    "max_delay": _integer,
    "fflags": _flags(*"nobuffer discardcorrupt genpts igndts ignidx nofillin noparse".split()),
    "correct_ts_overflow": _boolean,
    "scan_all_pmts": _integer,
    # RTSP
    "rtsp_transport": _flags("tcp", "udp", "udp_multicast"),
    "rtsp_flags": _flags("prefer_tcp", "filter_src"),
    "allowed_media_types": _flags("video", "audio", "data", "subtitle"),
    "reorder_queue_size": _integer,
    "min_port": _integer,
    "max_port": _integer,
    # sockets (RTSP, HTTP, UDP, RTMP)
    "timeout": _integer,
    "rw_timeout": _integer,
    "buffer_size": _integer,
    "fifo_size": _integer,
    "overrun_nonfatal": _boolean,
    "pkt_size": _integer,
    # HTTP(S) and HLS
    "user_agent": _text,
    "referer": _text,
    "headers": _header,
    "seekable": _integer,
    "multiple_requests": _boolean,
    "reconnect": _boolean,
    "reconnect_streamed": _boolean,
    "reconnect_on_network_error": _boolean,
    "reconnect_delay_max": _integer,
    "icy": _boolean,
    "live_start_index": _integer,
    "max_reload": _integer,
    "m3u8_hold_counters": _integer,
    "seg_max_retry": _integer,
    "http_persistent": _boolean,
    "http_multiple": _boolean,
    # TLS: verify the server (never a file to read: ca_file, cert_file, key_file)
    "tls_verify": _boolean,
}
"""Option -> the values it may take. Options that tune how a source is read, no more."""


def option_problem(key: str, value: str) -> str | None:
    """Why a definition may not set FFmpeg option ``key`` to ``value`` (None: it may).

    Names the key (option names are not secret) but never repeats the value."""
    check = ALLOWED_OPTIONS.get(key)
    if check is None:
        allowed = ", ".join(sorted(ALLOWED_OPTIONS))
        return (
            f"FFmpeg option {key!r} is not allowed (it could change what the ingest sends or "
            f"opens); allowed: {allowed}"
        )
    if len(value) > MAX_VALUE_CHARS:
        return f"FFmpeg option {key!r}: value longer than {MAX_VALUE_CHARS} characters"
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        return f"FFmpeg option {key!r}: value contains a control character (CR, LF, tab?)"
    if not check(value):
        return f"FFmpeg option {key!r}: {_expected(key)}"
    return None


def _expected(key: str) -> str:
    check = ALLOWED_OPTIONS[key]
    if check is _integer:
        return "expected an integer"
    if check is _boolean:
        return "expected 0 or 1"
    if check is _header:
        framing = ", ".join(sorted(FRAMING_HEADERS))
        return f"expected one 'Name: value' header line, not one of {framing}"
    if check is _text:
        return "expected a non-empty value"
    return "not one of the values it may take (see docs/cameras.md)"
