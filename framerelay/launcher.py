"""Start a ``framerelay worker`` as a local child process and wait until ready.

Used by the demo, the tests, the benchmarks and the orchestrator's ``local``
provider. It runs the worker only as a child process and imports none of it,
so it lives here, where the orchestrator may use it (``deploy`` imports no
``gpu_worker``). Secrets travel in the child's environment, never on its command line,
and the child gets an explicit environment: the few variables of this process
a Python program needs to run (:data:`INHERITED`) plus what the caller gives,
never a copy of this process's environment (which may hold signing keys, a
provider's API key or a test hook).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from framerelay.errors import ConfigError

EXIT_WAIT_S = 10.0
"""How long a worker that closed its stdout before announcing itself has to exit (its
exit code says it failed at once rather than hung)."""
INHERITED = frozenset({
    "PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV",
    "LD_LIBRARY_PATH", "FRAMERELAY_TIMEOUT_FACTOR", "OMP_NUM_THREADS",
})  # fmt: skip
INHERITED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "OMP_", "OPENBLAS_", "MKL_", "ORT_")


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment of a child worker: the inherited basics, then ``extra``."""
    base = {
        k: v
        for k, v in os.environ.items()
        if k in INHERITED or (k.startswith(INHERITED_PREFIXES) and "SECRET" not in k)
    }
    return {**base, **extra}


class LocalWorker:
    """A worker child process; ``start()`` returns once it announced readiness."""

    def __init__(
        self,
        secret: str | None = None,
        *,
        worker_id: str = "local-worker",
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        gpus: int = 1,
        remove_log: bool = False,
    ) -> None:
        """``gpus`` > 1: ``framerelay worker --gpus N``, a supervisor of one worker per GPU
        (ids ``<worker_id>-gpu<i>``); ``start()`` then waits for every one of them.
        ``remove_log``: :meth:`stop` deletes the temporary log it made (no ``log_path``
        given) when the worker exited cleanly; a log of a worker that failed stays."""
        self.worker_id = worker_id
        self.gpus = gpus
        self._secret = secret
        self._args = list(args)
        self._env = env or {}
        self.log_path = log_path or Path(
            tempfile.mkstemp(prefix="framerelay-worker-", suffix=".log")[1]
        )
        self._remove_log = remove_log and log_path is None
        self.proc: subprocess.Popen[str] | None = None
        self.info: dict[str, Any] = {}
        self.infos: list[dict[str, Any]] = []
        """Every worker's announcement, in GPU order (one without ``gpus``)."""
        self._log: IO[str] | None = None

    @property
    def url(self) -> str:
        return str(self.info["url"])

    @property
    def urls(self) -> list[str]:
        """Each worker's tunnel URL, in GPU order."""
        return [str(info["url"]) for info in self.infos]

    def start(self, timeout_s: float = 120.0) -> LocalWorker:
        extra = dict(self._env)
        if self._secret is not None:
            extra["FRAMERELAY_TOKEN_SECRETS"] = self._secret
        env = child_env({**extra, "FRAMERELAY_WORKER_WORKER_ID": self.worker_id})
        cmd = [
            sys.executable,
            "-m",
            "framerelay",
            "worker",
            "--announce",
            "--port",
            "0",
            *self._args,
            *(["--gpus", str(self.gpus)] if self.gpus > 1 else []),
        ]
        self._log = self.log_path.open("w", encoding="utf-8")
        self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            cmd, stdout=subprocess.PIPE, stderr=self._log, text=True, env=env
        )
        deadline = time.monotonic() + timeout_s
        infos = [
            json.loads(self._read_announce(max(0.0, deadline - time.monotonic())))
            for _ in range(self.gpus)
        ]
        self.infos = sorted(infos, key=lambda i: _gpu_index(str(i.get("worker_id", ""))))
        self.info = self.infos[0]
        return self

    def _read_announce(self, timeout_s: float) -> str:
        proc = self.proc
        assert proc is not None and proc.stdout is not None  # noqa: S101
        stdout = proc.stdout
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not result or not result[0].startswith("{"):
            exited = proc.poll()
            if exited is None and result == [""]:  # stdout closed: it is exiting; its code
                with contextlib.suppress(subprocess.TimeoutExpired):
                    exited = proc.wait(EXIT_WAIT_S)
            self.stop()
            tail = self.log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
            if exited is not None:  # it failed at once: say why, in one line
                said = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "no output")
                said = said.removeprefix("framerelay: error: ")
                raise ConfigError(f"the worker exited (code {exited}) before it was ready: {said}")
            raise ConfigError(
                f"worker did not become ready in {timeout_s:.0f} s; its log ends:\n{tail}"
            )
        return result[0]

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, wait, then SIGKILL; returns the exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()
        if self._log is not None:
            self._log.close()
        if self._remove_log and proc.returncode in (0, -signal.SIGTERM):
            self.log_path.unlink(missing_ok=True)
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL at once (fault tests), each worker of a ``gpus`` supervisor too."""
        for info in self.infos if self.gpus > 1 else []:
            pid = info.get("pid")
            if isinstance(pid, int) and pid > 1:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def __enter__(self) -> LocalWorker:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _gpu_index(worker_id: str) -> int:
    """``<id>-gpu<i>`` -> i (0 for any other id)."""
    tail = worker_id.rpartition("-gpu")[2]
    return int(tail) if tail.isdigit() else 0
