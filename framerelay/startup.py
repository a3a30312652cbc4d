"""What every service says when it starts, and its one-line bind errors.

Each service logs one ``ready`` line at INFO (in the ``--log-format`` chosen):
where it listens and what it loaded. A port already taken is a
:class:`~framerelay.errors.ConfigError` naming the address and the option or
variable that sets it, never a traceback.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import socket
import sys
from collections.abc import Mapping

from framerelay.errors import ConfigError

log = logging.getLogger("framerelay.startup")


def bind_error(exc: OSError, host: str, port: int, setting: str) -> ConfigError:
    """One actionable line for a failed bind of ``host:port`` (set by ``setting``)."""
    if exc.errno == errno.EADDRINUSE:
        return ConfigError(
            f"cannot listen on {host}:{port}: the address is already in use (another "
            f"process holds it); choose another port with {setting}, or 0 for any free port"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return ConfigError(f"cannot listen on {host}:{port}: no such address here ({setting})")
    if exc.errno == errno.EACCES:
        return ConfigError(
            f"cannot listen on {host}:{port}: permission denied (ports below 1024 need "
            f"privileges; {setting})"
        )
    return ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc} ({setting})")


def check_port(host: str, port: int, setting: str) -> None:
    """Fail fast, before a long start (model warm-up), when ``host:port`` cannot be bound."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except socket.gaierror:
            return  # a host name: the real bind says what is wrong with it
        except OSError as exc:
            raise bind_error(exc, host, port, setting) from None


def print_ready_json(info: Mapping[str, object]) -> None:
    """``info`` as one JSON line on stdout, written with a single ``write(2)``.

    Workers started together by ``framerelay worker --gpus`` share their
    parent's stdout; a pipe write under ``PIPE_BUF`` (4 KiB) is atomic, so
    their lines never interleave, even with ``PYTHONUNBUFFERED=1`` (where
    ``print`` writes the text and the newline in two calls).
    """
    data = (json.dumps(info) + "\n").encode()
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        sys.stdout.write(data.decode())  # a captured stdout (tests): no descriptor
        sys.stdout.flush()
        return
    sys.stdout.flush()
    os.write(fd, data)


def announce_ready(service: str, url: str, loaded: str) -> None:
    """The ready line: ``<service> listening on <url>; <what it loaded>``."""
    log.info("%s listening on %s; %s", service, url, loaded)
