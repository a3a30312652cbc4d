"""What a stream added over the API may make this ingest open, beyond any definition.

Every definition's source is checked when it is made (:func:`ingest.urls.url_problem`:
an allowed scheme or a file path; :func:`ingest.source_options.option_problem`), and
every open is limited to its scheme's protocols (:data:`ingest.urls.PROTOCOLS`). A
definition that comes over the network (``POST``/``PUT /v1/streams``, a
``streams:write`` token) is held to more, here:

* a **local file** only under ``file_roots`` (default: none, so no file at all), by
  its real path (``..`` and symlinks resolved, relative paths from the ingest's working
  folder); the answer is the same whether the file exists or not;
* a **network source** only at a host that resolves outside ``source_denied_networks``
  (default :data:`DENIED_NETWORKS`: link-local, which holds the 169.254.169.254
  metadata service, and the other clouds' metadata addresses). Loopback and private
  networks are allowed by default: cameras live on private networks and restreamers
  (MediaMTX, go2rtc) on the ingest's own host, and what a request to them can carry is
  limited (a plain GET, DESCRIBE or RTMP play: no method, header line breaks, body or
  other protocol). Add ``127.0.0.0/8`` and ``::1/128`` to refuse them.

The address is checked when the definition is made. FFmpeg resolves the host again at
each open and follows HTTP redirects and HLS segment URLs to other hosts (still within
the scheme's protocols): a DNS name that changes its answer, a redirect or a playlist
can reach a denied address. A host that does not resolve now is allowed (its opens fail
like any camera that is down).

The operator's own streams (settings, ``--config``/``--streams-file``, ``--source``, the
demo, the samples) are limited by neither.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from ingest.urls import local_path, source_scheme

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
DENIED_NETWORKS: tuple[Network, ...] = tuple(
    ipaddress.ip_network(net)
    for net in (
        "169.254.0.0/16",  # IPv4 link-local: AWS, GCP, Azure, OpenStack metadata (.169.254)
        "fe80::/10",  # IPv6 link-local
        "fd00:ec2::254/128",  # AWS metadata over IPv6
        "100.100.100.200/32",  # Alibaba Cloud metadata
        "168.63.129.16/32",  # Azure WireServer
    )
)
"""``source_denied_networks`` by default."""
ADDRESS_SCHEMES = frozenset({"rtsp", "rtsps", "rtmp", "rtmps", "http", "https", "rtp"})
"""Schemes whose host the ingest connects or sends to (a ``udp://`` host is the address
it listens on or the multicast group it joins: nothing is sent there)."""
RESOLVE_TIMEOUT_S = 5.0
ROOTS_ENV = "FRAMERELAY_INGEST_FILE_ROOTS"
DENIED_ENV = "FRAMERELAY_INGEST_SOURCE_DENIED_NETWORKS"


async def api_source_problem(
    url: str, file_roots: Sequence[Path], denied: Sequence[Network]
) -> str | None:
    """Why a stream added over the API may not read ``url`` (None: it may); never echoes
    the URL or the path."""
    path = local_path(url)
    if path is not None:
        return file_root_problem(path, file_roots)
    return await address_problem(url, denied)


def file_root_problem(path: str, roots: Sequence[Path]) -> str | None:
    """Why the API may not read local file ``path`` (None: it is under one of ``roots``)."""
    if not roots:
        return (
            f"local files cannot be added over the API: set {ROOTS_ENV} to the folders it "
            "may read, or define the stream in the ingest's configuration"
        )
    real = Path(os.path.realpath(path))
    if any(real.is_relative_to(os.path.realpath(root)) for root in roots):
        return None
    return f"the file is not under {ROOTS_ENV} (the folders the API may read)"


async def address_problem(url: str, denied: Sequence[Network]) -> str | None:
    """Why the API may not read network source ``url`` (None: its host is allowed)."""
    if not denied or source_scheme(url) not in ADDRESS_SCHEMES:
        return None
    host = urlsplit(url).hostname or ""
    for address in await _addresses(host):
        for network in denied:
            if address in network:
                return (
                    f"the source's host is in {network}, which {DENIED_ENV} refuses "
                    "(link-local and cloud metadata addresses by default)"
                )
    return None


async def _addresses(host: str) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Every address ``host`` resolves to now, as FFmpeg's getaddrinfo would (``2852039166``
    and ``0xa9.254.169.254`` included); IPv4-mapped IPv6 as IPv4. Empty if it does not."""
    try:
        async with asyncio.timeout(RESOLVE_TIMEOUT_S):
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, None, type=socket.SOCK_STREAM
            )
    except (OSError, TimeoutError, UnicodeError):
        return set()
    found: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            found.add(address.ipv4_mapped)
        else:
            found.add(address)
    return found
