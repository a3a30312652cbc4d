"""Shared set-up for the tests that use the ``[ultralytics]`` extra.

Importing this module points Ultralytics at a private, offline config dir
before Ultralytics is first imported (it reads those settings once).
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpu_worker.detectors.ultralytics_backend import configure_offline

CONFIG_DIR = tempfile.mkdtemp(prefix="framerelay-yolo-config-")
atexit.register(shutil.rmtree, CONFIG_DIR, True)
configure_offline(Path(CONFIG_DIR))

SKIP_REASON = (
    "the [ultralytics] extra is not installed: "
    "pip install -e '.[cpu,dev,ultralytics]' torch==2.14.1 torchvision==0.29.1"
)
# Ultralytics exports through torch's TorchScript-based ONNX exporter, which
# torch >= 2.9 deprecates; nothing here can choose the exporter.
TORCH_ONNX_DEPRECATIONS = (
    "ignore:You are using the legacy TorchScript-based ONNX export:DeprecationWarning",
    r"ignore:The feature will be removed\. Please remove usage:DeprecationWarning:torch\.onnx",
)


def _is_local(host: object) -> bool:
    text = host.decode() if isinstance(host, bytes) else str(host)
    return text in {"", "localhost", "::1"} or text.startswith("127.")


class NetworkGuard:
    """Refuses, and records, every DNS lookup or connection beyond loopback."""

    def __init__(self) -> None:
        self.attempts: list[str] = []

    def install(self, mp: pytest.MonkeyPatch) -> None:
        real_getaddrinfo = socket.getaddrinfo
        real_connect = socket.socket.connect
        real_connect_ex = socket.socket.connect_ex

        def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
            if not _is_local(host):
                self.attempts.append(f"getaddrinfo({host!r})")
                raise socket.gaierror(socket.EAI_NONAME, "network disabled in tests")
            return real_getaddrinfo(host, *args, **kwargs)

        def refuse(sock: socket.socket, address: Any) -> None:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_local(address[0]):
                self.attempts.append(f"connect({address!r})")
                raise OSError("network disabled in tests")

        def connect(sock: socket.socket, address: Any) -> None:
            refuse(sock, address)
            real_connect(sock, address)

        def connect_ex(sock: socket.socket, address: Any) -> int:
            refuse(sock, address)
            return real_connect_ex(sock, address)

        mp.setattr(socket, "getaddrinfo", getaddrinfo)
        mp.setattr(socket.socket, "connect", connect)
        mp.setattr(socket.socket, "connect_ex", connect_ex)


def import_ultralytics(guard: NetworkGuard | None = None) -> ModuleType:
    """Import Ultralytics (skipping with the install hint when absent), keeping its
    import-time ``OMP_NUM_THREADS=1`` from leaking into later tests."""
    with pytest.MonkeyPatch.context() as mp:
        if guard is not None:
            guard.install(mp)
        omp = os.environ.get("OMP_NUM_THREADS")
        try:
            pytest.importorskip("torch", reason=SKIP_REASON)
            module: ModuleType = pytest.importorskip("ultralytics", reason=SKIP_REASON)
            return module
        finally:
            if omp is None:
                os.environ.pop("OMP_NUM_THREADS", None)
