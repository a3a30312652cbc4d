"""``framerelay worker --gpus``: one worker process per GPU, pinned by ``CUDA_VISIBLE_DEVICES``.

``--gpus all`` starts one worker per GPU that NVML sees (and this process's own
``CUDA_VISIBLE_DEVICES`` allows); ``--gpus 0,1`` (indexes or ``GPU-`` UUIDs)
pins exactly those and needs no NVML; ``--gpus 4`` means the first four
(0..3). Worker ``i`` gets the worker id ``<id>-gpu<i>`` and the port
``<port>+k`` for the k-th GPU (``--port 0``: each its own free port), and runs
with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA numbers the GPUs as NVML and
``nvidia-smi`` do. This process only supervises: SIGTERM/SIGINT are passed on
to every worker, which shuts down gracefully; when a worker exits on its own,
the others are stopped and this process exits 1 with one line naming it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from types import FrameType

from framerelay.errors import ConfigError

log = logging.getLogger("framerelay.worker")
FAILURE = 1
POLL_S = 0.2
STOP_GRACE_S = 10.0
"""Added to the workers' own shutdown_timeout_s before a worker that ignores SIGTERM is killed."""
_NOT_FORWARDED = frozenset({"func", "command", "gpus", "port", "worker_id"})
CPU_HINT = (
    "to run on the CPU, start one worker without --gpus (--providers cpu); to pin GPUs "
    "without NVML, name them: --gpus 0,1"
)


@dataclass(frozen=True)
class GpuChoice:
    """What ``--gpus`` asked for: every GPU NVML sees, or these devices."""

    every: bool
    devices: tuple[str, ...] = ()


def parse_gpus(value: str) -> GpuChoice:
    """``all``, a count (``4`` = 0..3) or a list (``0,2``, ``GPU-<uuid>``); argparse's type."""
    text = value.strip()
    if text.lower() == "all":
        return GpuChoice(every=True)
    if text.isdigit():
        if int(text) < 1:
            raise argparse.ArgumentTypeError(f"{value!r}: ask for at least one GPU")
        return GpuChoice(False, tuple(str(i) for i in range(int(text))))
    entries = [e.strip() for e in text.split(",") if e.strip()]
    bad = [e for e in entries if not (e.isdigit() or e.startswith("GPU-"))]
    if not entries or bad:
        raise argparse.ArgumentTypeError(
            f"{value!r}: give 'all', a count, or GPU indexes / GPU-<uuid> separated by commas"
        )
    if len(set(entries)) != len(entries):
        raise argparse.ArgumentTypeError(f"{value!r}: a GPU is named twice")
    return GpuChoice(False, tuple(entries))


@dataclass(frozen=True)
class Plan:
    """One worker to start: the device it is pinned to, its id and port."""

    device: str
    worker_id: str
    port: int

    @property
    def label(self) -> str:
        return f"worker {self.worker_id} (CUDA_VISIBLE_DEVICES={self.device})"


def plan(devices: tuple[str, ...], worker_id: str, port: int) -> list[Plan]:
    """One worker per device: ids ``<id>-gpu<i>``, ports ``port+k`` (0 stays 0)."""
    if port and port + len(devices) - 1 > 65535:
        raise ConfigError(
            f"--port {port} with {len(devices)} GPUs needs ports up to "
            f"{port + len(devices) - 1}, past 65535: choose a lower --port (or 0)"
        )
    out = []
    for k, device in enumerate(devices):
        suffix = f"gpu{device}" if device.isdigit() else device[:12]
        out.append(Plan(device, f"{worker_id}-{suffix}", port + k if port else 0))
    return out


def forwarded_options(args: argparse.Namespace) -> list[str]:
    """The worker options given to this process, as a command line for each worker.

    Every ``framerelay worker`` option is ``--<dest with dashes>``; ``--gpus``,
    ``--port`` and ``--worker-id`` are set per worker instead.
    """
    out: list[str] = []
    for dest, value in vars(args).items():
        if dest in _NOT_FORWARDED or value is None or value is False:
            continue
        flag = "--" + dest.replace("_", "-")
        if value is True:
            out.append(flag)
            continue
        for item in value if isinstance(value, list) else [value]:
            out += [flag, str(item)]
    return out


def resolve(choice: GpuChoice) -> tuple[str, ...] | str:
    """The devices to pin, or (for ``all`` with no GPU) the one-line reason."""
    if not choice.every:
        return choice.devices
    from gpu_worker.gpu_stats import read_gpus

    status = read_gpus()
    if not status.available:
        return f"--gpus all found no GPU: {status.reason}; {CPU_HINT}"
    return tuple(str(g.index) for g in status.gpus)


def run_per_gpu(args: argparse.Namespace, worker_id: str, port: int, stop_s: float) -> int:
    """Start one worker per GPU and supervise them until a signal or one of them exits."""
    devices = resolve(args.gpus)
    if isinstance(devices, str):
        return _fail(devices)
    plans = plan(devices, worker_id, port)
    fleet = Fleet(plans, forwarded_options(args), stop_s + STOP_GRACE_S)
    return fleet.run()


def _fail(message: str) -> int:
    print(f"framerelay: error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    return FAILURE


class Fleet:
    """The worker children: started together, stopped together."""

    def __init__(self, plans: list[Plan], options: list[str], stop_s: float) -> None:
        self.plans = plans
        self.options = options
        self.stop_s = stop_s
        self.procs: list[subprocess.Popen[bytes]] = []
        self._told: set[int] = set()
        """Workers already sent SIGTERM: a second one, once a worker's shutdown has removed
        its handler, would kill it mid-way."""
        self.stopping: int | None = None
        """The signal that asked this process to stop, once one did."""

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._start()
            dead = self._watch()
            return self._stop(dead)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = signum
        self._forward(signal.SIGTERM)

    def _forward(self, sig: int) -> None:
        """``sig`` once to each worker still running."""
        for proc in self.procs:
            if proc.pid not in self._told and proc.poll() is None:
                self._told.add(proc.pid)
                proc.send_signal(sig)

    def _start(self) -> None:
        env = {**os.environ, "CUDA_DEVICE_ORDER": os.environ.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID")}
        for p in self.plans:
            if self.stopping is not None:
                return
            cmd = [sys.executable, "-m", "framerelay", "worker", *self.options]
            cmd += ["--worker-id", p.worker_id, "--port", str(p.port)]
            child_env = {**env, "CUDA_VISIBLE_DEVICES": p.device}
            # own process group: a terminal's Ctrl-C reaches this process alone, which
            # passes one SIGTERM on (two signals would cut a worker's shutdown short)
            proc = subprocess.Popen(cmd, env=child_env, process_group=0)  # noqa: S603
            self.procs.append(proc)
            log.info("started %s: pid %d, port %s", p.label, proc.pid, p.port or "any free")

    def _watch(self) -> int | None:
        """Until a signal (None) or a worker exits on its own (its position)."""
        while self.stopping is None:
            for k, proc in enumerate(self.procs):
                if proc.poll() is not None:
                    return k
            time.sleep(POLL_S)
        return None

    def _stop(self, dead: int | None) -> int:
        """SIGTERM the workers still running, wait, SIGKILL the late; the exit code."""
        self._forward(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_s
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if dead is not None:
            others = len(self.procs) - 1
            return _fail(
                f"{self.plans[dead].label} exited {_how(self.procs[dead].returncode)}; "
                f"stopped the other {others} worker(s)"
            )
        failed = [
            (p, proc.returncode)
            for p, proc in zip(self.plans, self.procs, strict=False)
            if proc.returncode
        ]
        if failed:
            said = ", ".join(f"{p.label} exited {_how(code)}" for p, code in failed)
            return _fail(f"while stopping: {said}")
        return 0


def _how(code: int | None) -> str:
    if code is not None and code < 0:
        return f"on signal {signal.Signals(-code).name}"
    return f"with code {code}"
