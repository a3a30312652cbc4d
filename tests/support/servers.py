"""Real servers for ingest tests: an RTSP server (GStreamer), ffmpeg as an RTMP
server, a static HTTP server (files, HLS), a private redis-server.

Every start and stop is bounded; every process is ended by its own pid.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from tests.conftest import TIMEOUT_FACTOR
from tests.support.waiting import wait_until

SYSTEM_PYTHON = "/usr/bin/python3"
RTSP_SCRIPT = Path(__file__).with_name("rtsp_server.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s")
        time.sleep(0.05)


def wait_listening(port: int, timeout_s: float) -> None:
    """Wait for a LISTEN socket on ``port`` without connecting to it (``ffmpeg -listen 1``
    serves exactly one client: a probe connection would use it up)."""
    deadline = time.monotonic() + timeout_s
    want = f":{port:04X} "
    while True:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(OSError), open(table, encoding="ascii") as f:
                for line in f.readlines()[1:]:
                    fields = line.split()
                    if (fields[1] + " ").endswith(want) and fields[3] == "0A":
                        return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on port {port} after {timeout_s} s")
        time.sleep(0.05)


def _end(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
            os.kill(proc.pid, sig)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


class RtspServer:
    """gst-rtsp-server playing an H.264 MP4 at ``rtsp://127.0.0.1:<port>/cam``.

    Runs under the system Python (it has ``gi``). ``kill()`` is SIGKILL,
    ``pause()``/``resume()`` SIGSTOP/SIGCONT; ``start()`` again on the same
    port restarts it (a camera coming back).
    """

    def __init__(
        self,
        clip: Path,
        port: int | None = None,
        *,
        codec: str = "h264",
        user: str = "",
        password: str = "",
    ) -> None:
        self.clip = clip
        self.codec = codec
        self.port = port or free_port()
        self.user, self.password = user, password
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_at: float | None = None
        """monotonic time at which the last start() saw the server listening."""

    @property
    def url(self) -> str:
        return f"rtsp://127.0.0.1:{self.port}/cam"

    def start(self, timeout_s: float = 20.0) -> RtspServer:
        if shutil.which(SYSTEM_PYTHON) is None:
            raise RuntimeError(f"{SYSTEM_PYTHON} missing: run scripts/services.sh")
        args = [SYSTEM_PYTHON, str(RTSP_SCRIPT), "--port", str(self.port), "--clip", str(self.clip),
                "--codec", self.codec]  # fmt: skip
        if self.user:
            args += ["--user", self.user, "--password", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s * TIMEOUT_FACTOR
        line = b""
        while not line.startswith(b"READY"):
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(left, 0))
            if not ready or self.proc.poll() is not None:
                self.kill()
                raise RuntimeError(f"RTSP server did not start on port {self.port}")
            line = self.proc.stdout.readline()
        self.ready_at = time.monotonic()
        return self

    def kill(self) -> None:
        if self.proc is not None:
            _end(self.proc, signal.SIGKILL)
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            _end(self.proc)
            self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def __enter__(self) -> RtspServer:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.kill()


@contextlib.contextmanager
def rtmp_server(clip: Path) -> Iterator[str]:
    """ffmpeg listening as an RTMP server, playing ``clip`` in real time to one reader."""
    port = free_port()
    url = f"rtmp://127.0.0.1:{port}/live/cam"
    proc = subprocess.Popen(
        ["ffmpeg", "-hide_banner", "-loglevel", "quiet", "-re", "-stream_loop", "-1", "-i",
         str(clip), "-c", "copy", "-f", "flv", "-listen", "1", url],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_listening(port, 10 * TIMEOUT_FACTOR)
        yield url
    finally:
        _end(proc, signal.SIGKILL)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        return None


@contextlib.contextmanager
def http_server(root: Path) -> Iterator[str]:
    """A static HTTP server for ``root`` on a free loopback port; yields its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class RedisServer:
    """A private ``redis-server`` on a free loopback port (never the shared 6379): started,
    stopped, killed (-9) and started again on the same port and folder."""

    def __init__(self, folder: Path, *, appendonly: bool = True) -> None:
        self.folder = folder
        self.port = free_port()
        self.appendonly = appendonly
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start it and wait until it answers PING (it accepts connections while it still
        loads its append-only file)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        exe = shutil.which("redis-server")
        assert exe is not None, "redis-server is not installed (scripts/services.sh)"
        cmd = [
            exe,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(self.folder),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "everysec",
            "--daemonize",
            "no",
            "--logfile",
            "redis.log",
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self.ping, 10, f"redis-server on {self.port} answering")
        return self

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill9(self) -> None:
        """SIGKILL: what a crash leaves (the append-only file as far as it was synced)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None:
            _end(self.proc)
            self.proc = None


@contextlib.contextmanager
def redis_server(folder: Path, *, appendonly: bool = False) -> Iterator[RedisServer]:
    """A started :class:`RedisServer` (without append-only file by default), stopped after."""
    server = RedisServer(folder, appendonly=appendonly).start()
    try:
        yield server
    finally:
        server.stop()


class CountingListener:
    """A loopback TCP listener that accepts and counts every connection (never answers):
    the witness that a refused URL reached nothing (``connections == 0``)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@contextlib.contextmanager
def counting_listener() -> Iterator[CountingListener]:
    listener = CountingListener()
    try:
        yield listener
    finally:
        listener.close()
