"""The worker side of ``bench/gpu.py``: the real worker in a spawned child process, the
bare loops it runs on the same detector, and GPU utilisation sampled meanwhile.

The child serves the real ``gpu_worker.server.Worker`` (the real ``OnnxDetector``
loaded from the settings) and says ``("ready", {port, input, batch, providers})``
on its pipe; on ``("bare", jpegs, letterbox, warmup_s, seconds)`` it runs
:func:`bare_loops` on the worker's own detector and decode pool and answers
``("bare", {bare_fps, model_fps})``; anything else stops it. A failure is one
``("error", "Type: message")`` line, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from framerelay.geometry import Letterbox
    from gpu_worker.detectors import Detector
    from gpu_worker.server import Worker

WORKER_ID = "bench-gpu"


def _worker_main(secret: str, options: dict[str, Any], conn: Connection) -> None:
    """Serve the real worker; on ("bare", ...) run the bare loops on its detector."""
    try:
        worker = _build_worker(secret, options)
        asyncio.run(_serve(worker, conn))
    except Exception as exc:  # one line to the parent, never a traceback
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _build_worker(secret: str, options: dict[str, Any]) -> Worker:
    from gpu_worker.server import Worker

    return Worker(worker_settings(secret, options))


def worker_settings(secret: str, options: dict[str, Any]) -> Any:
    """The worker's settings (validated: raises pydantic's ValidationError or ConfigError)."""
    from gpu_worker.detectors import OnnxDetectorSettings
    from gpu_worker.settings import WorkerSettings

    detector = OnnxDetectorSettings.model_validate(options["detector"])
    return WorkerSettings(host="127.0.0.1", port=0, worker_id=WORKER_ID, token_secrets=secret,
                          detector=detector, warmup_runs=2, **options["worker"])  # fmt: skip


def acceleration(detector: object) -> dict[str, Any]:
    """What the backend turned on (FP16, IO binding, engine cache), where it says so."""
    value = getattr(detector, "acceleration", None)
    as_info = getattr(value, "as_info", None)
    return dict(as_info()) if callable(as_info) else {}


async def _serve(worker: Worker, conn: Connection) -> None:
    _, port = await worker.start()
    w, h = worker.detector.input_size
    conn.send(("ready", {"port": port, "input": [w, h], "batch": worker.batcher.max_batch,
                         "providers": list(worker.detector.providers),
                         "acceleration": acceleration(worker.detector)}))  # fmt: skip
    stop = asyncio.Event()
    serving = asyncio.create_task(worker.serve_forever(stop))
    try:
        while True:
            message = await asyncio.to_thread(conn.recv)
            if message[0] != "bare":
                break
            _, jpegs, letterbox, warmup_s, seconds = message
            args = (worker.detector, worker.decode_pool, jpegs, letterbox, worker.batcher.max_batch,
                    warmup_s, seconds, worker.batcher.decoder)  # fmt: skip
            conn.send(("bare", await asyncio.to_thread(bare_loops, *args)))
    except EOFError:
        pass  # the parent is gone
    finally:
        stop.set()
        await serving


def bare_loops(detector: Detector, pool: Executor, jpegs: Sequence[bytes], letterbox: Letterbox,
               batch: int, warmup_s: float, seconds: float,
               decoder: Any = None) -> dict[str, float]:  # fmt: skip
    """Frames/s of decode + infer (pipelined), then of infer alone, flat out; ``decoder``:
    the worker's batch decoder (its decode stage), else each JPEG alone in ``pool``."""
    from gpu_worker.detectors import ModelInput
    from gpu_worker.images import decode_jpeg_bgr

    w, h = detector.input_size
    decoded = [ModelInput(decode_jpeg_bgr(jpegs[k % len(jpegs)], w, h), letterbox)
               for k in range(batch)]  # fmt: skip
    loop = _Pipelined(detector, pool, jpegs, letterbox, batch, decoder)
    full = _flat_out(loop.step, batch, warmup_s, seconds)
    alone = _flat_out(lambda: detector.infer(decoded), batch, min(warmup_s, 1.0), seconds / 2)
    return {"bare_fps": full, "model_fps": alone}


class _Pipelined:
    """Decode + infer, one batch a step; the next batch decodes while this one infers."""

    def __init__(self, detector: Detector, pool: Executor, jpegs: Sequence[bytes],
                 letterbox: Letterbox, batch: int, decoder: Any = None) -> None:  # fmt: skip
        self.detector, self.pool, self.jpegs = detector, pool, jpegs
        self.letterbox, self.batch, self.decoder = letterbox, batch, decoder
        self.stage = ThreadPoolExecutor(1, thread_name_prefix="bare-decode")
        self.next = 0
        self.pending = self._submit()

    def _submit(self) -> list[Future[Any]]:
        from gpu_worker.images import decode_jpeg_bgr

        w, h = self.detector.input_size
        n, start = len(self.jpegs), self.next
        self.next += self.batch
        items = [self.jpegs[(start + k) % n] for k in range(self.batch)]
        if self.decoder is not None:  # one job per batch, as the worker's decode stage
            return [self.stage.submit(self.decoder.decode, items, w, h)]
        return [self.pool.submit(decode_jpeg_bgr, item, w, h) for item in items]

    def step(self) -> None:
        from gpu_worker.detectors import ModelInput

        done = [f.result() for f in self.pending]
        images = done[0] if self.decoder is not None else done
        self.pending = self._submit()
        self.detector.infer([ModelInput(image, self.letterbox) for image in images])


def _flat_out(step: Callable[[], object], batch: int, warmup_s: float, seconds: float) -> float:
    """Frames/s of ``step`` (one batch) run again and again, after ``warmup_s``."""
    first = time.perf_counter() + warmup_s
    while time.perf_counter() < first:
        step()
    start, done = time.perf_counter(), 0
    while (now := time.perf_counter()) - start < seconds or done == 0:
        step()
        done += batch
    return done / (now - start)


def start_worker(secret: str, options: dict[str, Any]) -> tuple[Any, Connection]:
    """The worker child (spawned) and this side's end of its pipe."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_worker_main, args=(secret, options, child), daemon=True)
    proc.start()
    child.close()
    return proc, parent


def wait_ready(proc: Any, conn: Connection, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while not conn.poll(0.2):
        if not proc.is_alive():
            raise SystemExit(f"the worker process exited ({proc.exitcode}) before it was ready")
        if time.monotonic() > deadline:
            raise SystemExit(f"the worker was not ready within --start-timeout {timeout_s:g} s "
                             "(a first TensorRT engine build can take minutes)")  # fmt: skip
    kind, body = conn.recv()
    if kind == "error":
        raise SystemExit(f"the worker did not start: {body}")
    return dict(body)


def answer(conn: Connection) -> tuple[str, Any]:
    try:
        kind, body = conn.recv()
    except EOFError:
        raise SystemExit("the worker process died during the bare loop") from None
    return str(kind), body


class GpuSampler:
    """Mean utilisation of the first visible GPU while ``sampling()``; no GPU: nothing."""

    def __init__(self, every_s: float = 0.5) -> None:
        from gpu_worker.gpu_stats import read_gpus

        self._read = read_gpus
        status = read_gpus()
        self.name = status.gpus[0].name if status.available and status.gpus else None
        self.reason = status.reason
        self.every_s = every_s

    @contextlib.contextmanager
    def sampling(self, into: list[float]) -> Iterator[None]:
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(self.every_s):
                status = self._read()
                util = status.gpus[0].utilization_pct if status.gpus else None
                if util is not None:
                    into.append(util)

        thread = threading.Thread(target=sample, name="nvml", daemon=True)
        if self.name is not None:
            thread.start()
        try:
            yield
        finally:
            stop.set()
            if thread.is_alive():
                thread.join(2)
