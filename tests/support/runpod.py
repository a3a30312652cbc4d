"""Helpers for tests against the RunPod API v2 contract server
(:mod:`bench.rig.runpod_v2_contract`): what an operator makes through the API before
the orchestrator runs (a template, a network volume), and a pod's "container": a real
``framerelay worker`` started from the pod as RunPod shows it (its env, its ``args``,
its ``N/tcp`` ports); and ``framerelay orchestrator`` as a process (the Kubernetes
scenarios start it here too)."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from redis import Redis

from framerelay.launcher import LocalWorker
from tests.conftest import MODEL, ROOT, TIMEOUT_FACTOR

Stop = Callable[[], None]


def api_post(url: str, key: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """``POST {url}{path}`` with the key; the created object."""
    resp = httpx.post(f"{url}{path}", json=body, headers={"Authorization": f"Bearer {key}"})
    assert resp.status_code == 201, resp.text
    made: dict[str, Any] = resp.json()
    return made


def add_template(url: str, key: str, **fields: Any) -> dict[str, Any]:
    return api_post(url, key, "/templates", fields)


def add_volume(url: str, key: str, name: str, size: int, centre: str) -> dict[str, Any]:
    return api_post(
        url, key, "/network-volumes", {"name": name, "size": size, "dataCenter": centre}
    )


def tcp_ports(pod: dict[str, Any]) -> list[int]:
    return [int(p.split("/")[0]) for p in pod["ports"] if p.endswith("/tcp")]


def launch_worker(
    pod: dict[str, Any], *, env_over: dict[str, str] | None = None, kill: bool = False
) -> tuple[str, dict[int, int], Stop]:
    """The container: the image's ``framerelay`` entrypoint with the pod's ``args``
    (``worker`` by default, ``worker --gpus N`` for a pod of N GPUs) and env (which holds
    no private key set and no shared secret), one public port per exposed TCP port.
    ``kill``: its stop is a SIGKILL (a lost host), not a clean stop."""
    env = dict(pod["env"])
    assert "FRAMERELAY_TOKEN_SECRETS" not in env and "FRAMERELAY_SIGNING_KEYS" not in env
    env.pop("FRAMERELAY_WORKER_HOST", None)
    env.update(env_over or {})
    args = shlex.split(pod["args"]) or ["worker"]
    gpus = int(args[2]) if args[:2] == ["worker", "--gpus"] else 1
    worker = LocalWorker(
        None,
        worker_id=env.pop("FRAMERELAY_WORKER_WORKER_ID"),
        env=env,
        gpus=gpus,
        args=["--model", str(MODEL), "--threads", "1", "--host", "127.0.0.1"],
    )
    worker.start(120 * TIMEOUT_FACTOR)
    ports = [int(url.rsplit(":", 1)[1].split("/")[0]) for url in worker.urls]
    exposed = tcp_ports(pod)
    assert len(exposed) == len(ports), (exposed, ports)

    def stop() -> None:
        if kill:
            worker.kill()
        worker.stop()

    return "127.0.0.1", dict(zip(exposed, ports, strict=True)), stop


def start_orchestrator(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[str], str]:
    """``framerelay --log-level DEBUG orchestrator --port 0`` with exactly ``env`` (its
    stderr appended to ``log``); the process and the URL its ready line gives."""
    args = [sys.executable, "-m", "framerelay", "--log-level", "DEBUG", "orchestrator"]
    with log.open("a") as err:
        proc = subprocess.Popen(
            [*args, "--port", "0"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("{"), log.read_text()[-3000:]
    return proc, str(json.loads(line)["url"])


@dataclass
class Orchestrator:
    """A running ``framerelay orchestrator`` and its API, as the scenarios read it."""

    proc: subprocess.Popen[str]
    url: str
    headers: dict[str, str]
    log: Path
    started: float

    def get(self, path: str) -> Any:
        resp = httpx.get(f"{self.url}{path}", headers=self.headers, timeout=10)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def pods(self) -> list[dict[str, Any]]:
        pods: list[dict[str, Any]] = self.get("/v1/pods")
        return pods

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.get("/v1/events")["events"] if e["kind"] == kind]


@contextmanager
def running_orchestrator(
    env: dict[str, str], log: Path
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """:func:`start_orchestrator`; on the way out SIGTERM (it stops within 30 s) and its
    Redis keys (``FRAMERELAY_ORCH_KEY_PREFIX``) removed."""
    proc, url = start_orchestrator(env, log)
    try:
        yield proc, url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        redis = Redis()
        for key in redis.scan_iter(match=env["FRAMERELAY_ORCH_KEY_PREFIX"] + "*"):
            redis.delete(key)
        redis.close()
