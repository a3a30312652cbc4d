"""``framerelay worker --gpus`` (issue 14): one worker process per GPU.

The parsing, the plan (ids, ports) and the forwarded options are tested as
code; the supervisor with real processes on this CPU machine: ``--gpus 0,1``
needs no NVML (it only pins ``CUDA_VISIBLE_DEVICES``), so two CPU workers
serve, each with its own id and device; SIGTERM to the parent stops both; a
worker that dies ends the parent with one line naming it. ``--gpus all`` with
no GPU is one line and exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from framerelay.cli import build_parser
from framerelay.commands.worker_gpus import GpuChoice, Plan, forwarded_options, parse_gpus, plan
from framerelay.errors import ConfigError
from gpu_worker.gpu_stats import read_gpus
from tests.conftest import MODEL, ROOT, TIMEOUT_FACTOR
from tests.support.auth import mint
from tests.support.cli_runs import clean_env, run_all

SECRET = "worker-gpus-secret-worker-gpus-secret-0123456789"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("all", GpuChoice(every=True)),
        (" ALL ", GpuChoice(every=True)),
        ("2", GpuChoice(False, ("0", "1"))),
        ("0,1", GpuChoice(False, ("0", "1"))),
        ("3,", GpuChoice(False, ("3",))),  # one GPU by index, not a count
        ("GPU-8f2a,1", GpuChoice(False, ("GPU-8f2a", "1"))),
    ],
)
def test_gpus_values(value: str, expected: GpuChoice) -> None:
    assert parse_gpus(value) == expected


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("0", "at least one GPU"),
        ("", "give 'all', a count"),
        ("-1", "give 'all', a count"),
        ("cuda:0", "give 'all', a count"),
        ("1,1", "named twice"),
    ],
)
def test_bad_gpus_values_say_what_to_give(value: str, said: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=said):
        parse_gpus(value)


def test_plan_ids_and_ports() -> None:
    assert plan(("0", "1"), "fm", 9000) == [Plan("0", "fm-gpu0", 9000), Plan("1", "fm-gpu1", 9001)]
    assert [p.port for p in plan(("2", "5"), "fm", 0)] == [0, 0]
    assert plan(("GPU-8f2a1b2c3d4e5f",), "fm", 0)[0].worker_id == "fm-GPU-8f2a1b2c"
    with pytest.raises(ConfigError, match="past 65535"):
        plan(("0", "1"), "fm", 65535)


def test_each_worker_gets_the_options_given_but_its_own_id_and_port() -> None:
    args = build_parser().parse_args(
        ["--log-level", "debug", "worker", "--gpus", "all", "--port", "9000",
         "--worker-id", "fm", "--model", "m.onnx", "--threads", "2", "--announce"]
    )  # fmt: skip
    assert forwarded_options(args) == [
        "--log-level", "DEBUG", "--model", "m.onnx", "--threads", "2", "--announce",
    ]  # fmt: skip


def test_gpus_all_without_a_gpu_is_one_line_and_exit_1() -> None:
    status = read_gpus()
    if status.available:
        pytest.skip("this machine has a GPU")
    [run] = run_all([(["worker", "--gpus", "all", "--model", str(MODEL)], clean_env())])
    assert run.rc == 1, run
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("framerelay: error: --gpus all found no GPU: "), lines
    assert "without --gpus (--providers cpu)" in lines[0]
    assert "Traceback" not in run.stderr


class Pair:
    """``framerelay worker --gpus 0,1`` on the CPU, read up to both workers' ready lines."""

    def __init__(self, log: Path, gpus: str = "0,1", workers: int = 2) -> None:
        self.log = log
        self.stderr = log.open("w")
        # Unbuffered, as CI once ran it: print() then wrote the JSON and its newline in two
        # calls and two workers' ready lines interleaved on the shared pipe.
        env = clean_env(FRAMERELAY_TOKEN_SECRETS=SECRET, PYTHONUNBUFFERED="1")
        cmd = [sys.executable, "-m", "framerelay", "worker", "--gpus", gpus, "--port", "0",
               "--worker-id", "fm", "--model", str(MODEL), "--providers", "cpu",
               "--threads", "1", "--announce"]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=self.stderr, text=True
        )
        try:
            self.ready = {r["worker_id"]: r for r in (self._line() for _ in range(workers))}
        except BaseException:
            self.close()  # no child left running, no pipe left to the garbage collector
            raise

    def _line(self) -> dict[str, str]:
        stdout = self.proc.stdout
        assert stdout is not None
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(60 * TIMEOUT_FACTOR)
        assert got and got[0].startswith("{"), self.log.read_text()
        return dict(json.loads(got[0]))

    def info(self, worker_id: str) -> dict[str, object]:
        base = self.ready[worker_id]["url"].replace("ws://", "http://").removesuffix("/v1/tunnel")
        token = mint(SECRET, [f"worker:{worker_id}"], "worker")
        resp = httpx.get(f"{base}/info", headers={"Authorization": f"Bearer {token}"}, timeout=10)
        resp.raise_for_status()
        return dict(resp.json())

    def children(self) -> dict[str, int]:
        """The workers' process ids by worker id (Linux /proc)."""
        pid = self.proc.pid
        out = {}
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            out[argv[argv.index(b"--worker-id") + 1].decode()] = int(child)
        return out

    def wait(self) -> int:
        return self.proc.wait(30 * TIMEOUT_FACTOR)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.stderr.close()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    started = Pair(tmp_path / "parent.log")
    try:
        yield started
    finally:
        started.close()


@pytest.mark.integration
def test_one_worker_per_gpu_serves_and_sigterm_stops_them_all(pair: Pair) -> None:
    assert set(pair.ready) == {"fm-gpu0", "fm-gpu1"}
    for k, worker_id in enumerate(("fm-gpu0", "fm-gpu1")):
        info = pair.info(worker_id)
        assert info["worker_id"] == worker_id
        assert info["providers"] == ["CPUExecutionProvider"]
        gpus = info["gpus"]
        assert isinstance(gpus, dict) and gpus["cuda_visible_devices"] == str(k), gpus
    children = pair.children()
    assert set(children) == {"fm-gpu0", "fm-gpu1"}
    pair.proc.send_signal(signal.SIGTERM)
    assert pair.wait() == 0, pair.log.read_text()
    assert not [c for c in children.values() if Path(f"/proc/{c}").exists()]


@pytest.mark.integration
def test_a_worker_that_dies_ends_the_parent_with_one_line_naming_it(pair: Pair) -> None:
    children = pair.children()
    os.kill(children["fm-gpu1"], signal.SIGKILL)
    assert pair.wait() == 1
    errors = [ln for ln in pair.log.read_text().splitlines() if ln.startswith("framerelay: error")]
    assert errors == [
        "framerelay: error: worker fm-gpu1 (CUDA_VISIBLE_DEVICES=1) exited on signal SIGKILL; "
        "stopped the other 1 worker(s)"
    ], pair.log.read_text()
    assert not Path(f"/proc/{children['fm-gpu0']}").exists()


@pytest.mark.gpu
@pytest.mark.integration
def test_gpus_all_pins_one_worker_to_each_gpu_and_reports_its_readings(tmp_path: Path) -> None:
    """On a GPU machine: one worker per GPU NVML sees, each reading only its own GPU
    (inference on the CPU provider: this is about pinning, not speed)."""
    status = read_gpus()
    if not status.available:
        pytest.skip(f"no GPU here: {status.reason}")
    pair = Pair(tmp_path / "parent.log", gpus="all", workers=len(status.gpus))
    try:
        assert set(pair.ready) == {f"fm-gpu{g.index}" for g in status.gpus}
        for gpu in status.gpus:
            gpus = pair.info(f"fm-gpu{gpu.index}")["gpus"]
            assert isinstance(gpus, dict) and gpus["available"] is True, gpus
            assert gpus["cuda_visible_devices"] == str(gpu.index)
            [device] = gpus["devices"]
            assert (device["index"], device["uuid"]) == (gpu.index, gpu.uuid)
            assert device["memory_total_bytes"] == gpu.memory_total_bytes
        pair.proc.send_signal(signal.SIGTERM)
        assert pair.wait() == 0, pair.log.read_text()
    finally:
        pair.close()
