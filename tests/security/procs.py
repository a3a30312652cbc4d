"""Services as real processes for the security tests: ``framerelay ingest`` and
``framerelay orchestrator`` with their output in files, the processes they start
(found through /proc), and what each was given (argv, environment)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from redis import Redis

from tests.conftest import ROOT, TIMEOUT_FACTOR, service_env


@dataclass
class Service:
    """A ``framerelay`` process; stdout and stderr go to files next to each other."""

    name: str
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path
    url: str = ""
    seen: dict[str, bytes] = field(default_factory=dict)
    """Its argv and environment, read from /proc while it ran."""

    def output(self) -> str:
        return "".join(p.read_text(errors="replace") for p in (self.out, self.err) if p.exists())

    def remember(self) -> None:
        self.seen.update(given(self.proc.pid))

    def stop(self, timeout_s: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s * TIMEOUT_FACTOR)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def spawn(name: str, args: Sequence[str], env: dict[str, str], folder: Path) -> Service:
    """``python -m framerelay ARGS`` with exactly :func:`service_env` + ``env``."""
    folder.mkdir(parents=True, exist_ok=True)
    out, err = folder / f"{name}.out", folder / f"{name}.err"
    with out.open("wb") as fo, err.open("wb") as fe:
        proc = subprocess.Popen(
            [sys.executable, "-m", "framerelay", *args],
            env=service_env(**env), cwd=ROOT, stdout=fo, stderr=fe,
        )  # fmt: skip
    return Service(name, proc, out, err)


def run_cli(args: Sequence[str], env: dict[str, str], timeout_s: float = 60.0) -> Any:
    """``python -m framerelay ARGS`` to completion (a CompletedProcess with text output)."""
    return subprocess.run(
        [sys.executable, "-m", "framerelay", *args], env=service_env(**env), cwd=ROOT,
        capture_output=True, text=True, timeout=timeout_s * TIMEOUT_FACTOR, check=False,
    )  # fmt: skip


def ready_line(svc: Service, timeout_s: float = 30.0) -> dict[str, Any]:
    """The JSON line a service prints once it serves (the orchestrator's ``{"url": ..}``)."""
    deadline = time.monotonic() + timeout_s * TIMEOUT_FACTOR
    while time.monotonic() < deadline:
        for line in svc.out.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                return dict(json.loads(line))
        if svc.proc.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"{svc.name} did not start: {svc.output()[-2000:]}")


def wait_healthy(svc: Service, base: str, timeout_s: float = 30.0, **client: Any) -> None:
    deadline = time.monotonic() + timeout_s * TIMEOUT_FACTOR
    while time.monotonic() < deadline:
        if svc.proc.poll() is not None:
            break
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{base}/healthz", timeout=2, **client).status_code == 200:
                svc.url = base
                return
        time.sleep(0.1)
    raise RuntimeError(f"{svc.name} is not healthy: {svc.output()[-2000:]}")


def given(pid: int) -> dict[str, bytes]:
    """What a process was started with: ``cmdline`` and ``environ`` (NUL-separated)."""
    proc = Path(f"/proc/{pid}")
    out: dict[str, bytes] = {}
    for part in ("cmdline", "environ"):
        with contextlib.suppress(OSError):
            out[part] = (proc / part).read_bytes()
    return out


def children(pid: int) -> list[int]:
    """Live processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def worker_children(pid: int) -> list[int]:
    """The ``framerelay worker`` processes ``pid`` started (a local provider's pods)."""
    return [c for c in children(pid) if b"\0worker\0" in given(c).get("cmdline", b"")]


@contextlib.contextmanager
def redis_prefix(name: str) -> Iterator[str]:
    """A unique Redis key prefix, its keys deleted afterwards."""
    prefix = f"test-sec-{name}-{os.getpid()}-{time.monotonic_ns()}:"
    try:
        yield prefix
    finally:
        redis = Redis()
        for key in redis.scan_iter(match=prefix + "*"):
            redis.delete(key)
        redis.close()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
