"""Acceptance 2 and 6: the orchestrator is killed (-9) between "pod created" (the
RunPod API v2 contract server has it) and "pod recorded" (its answer never arrives);
after a restart there is no orphaned and no duplicate pod. The API key and the
signing keys never show in the orchestrator's logs, errors, metrics or API
answers; the pods' env holds only the public key set and their certificates."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis import Redis

from bench.rig.runpod_v2_contract import Call, ContractServer, Reply, running_runpod_v2
from tests.conftest import ROOT, TIMEOUT_FACTOR, service_env
from tests.support.auth import ed_keys, mint
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration]
KEY = "rpa_" + "Cr4shT3stK3y" * 3


class Crashing(ContractServer):
    """Calls ``on_create`` once a pod is made, before its answer goes out."""

    on_create: Callable[[], None] | None = None

    def _create_pod(self, call: Call) -> Reply:
        reply = super()._create_pod(call)
        if self.on_create is not None:
            self.on_create()
        return reply

    def by_name(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for pod in list(self.pods.values()):
            out.setdefault(pod.name, []).append(pod.id)
        return out


def _start(
    env: dict[str, str], log: Path, started: list[subprocess.Popen[str]], wait_ready: bool = True
) -> tuple[subprocess.Popen[str], str]:
    with log.open("a") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "framerelay", "--log-level", "DEBUG", "orchestrator",
             "--port", "0"],
            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True,
        )  # fmt: skip
    started.append(proc)
    assert proc.stdout is not None
    if not wait_ready:
        return proc, ""
    line = proc.stdout.readline()
    assert line.startswith("{"), log.read_text()[-2000:]
    return proc, str(json.loads(line)["url"])


def test_crash_between_created_and_recorded(tmp_path: Path) -> None:
    state = Crashing(KEY)
    keys = ed_keys()
    keys_file = tmp_path / "signing.jwks"
    keys_file.write_text(keys.to_json())
    auth = {"Authorization": f"Bearer {mint(keys, ['fleet:read'], 'orchestrator', ttl=600)}"}
    log = tmp_path / "orchestrator.log"
    prefix = f"test-crash-{os.getpid()}-{time.monotonic_ns()}:"
    tiers = [{"name": "community", "min_warm": 2, "max_workers": 2,
              "cloud_types": ["COMMUNITY"]}]  # fmt: skip
    with running_runpod_v2(state) as base:
        env = {
            **service_env(),
            "FRAMERELAY_SIGNING_KEYS_FILE": str(keys_file),
            "FRAMERELAY_ORCH_CA_DIR": str(tmp_path / "ca"),
            "FRAMERELAY_ORCH_PROVIDER": "runpod", "FRAMERELAY_ORCH_RUNPOD__API_KEY": KEY,
            "FRAMERELAY_ORCH_RUNPOD__BASE_URL": base, "FRAMERELAY_ORCH_RUNPOD__BACKOFF_S": "0.05",
            "FRAMERELAY_ORCH_KEY_PREFIX": prefix, "FRAMERELAY_ORCH_TICK_S": "0.3",
            "FRAMERELAY_ORCH_LEASE_TTL_S": "1", "FRAMERELAY_ORCH_TIERS": json.dumps(tiers),
        }  # fmt: skip
        procs: list[subprocess.Popen[str]] = []
        state.on_create = lambda: os.kill(procs[0].pid, signal.SIGKILL)
        first, _ = _start(env, log, procs, wait_ready=False)
        assert first.wait(30 * TIMEOUT_FACTOR) == -signal.SIGKILL
        assert first.stdout is not None
        first.stdout.close()
        assert len(state.pods) == 1  # created at the provider, never recorded
        state.on_create = None
        state.knobs.fail_next = 2  # and a flaky API on the way back
        second, url = _start(env, log, procs)
        try:

            def pods() -> list[dict[str, Any]]:
                return list(httpx.get(f"{url}/v1/pods", headers=auth).json())

            wait_until(
                lambda: len(pods()) == 2 and all(p["provider_id"] for p in pods()),
                30,
                "two recorded pods",
                every_s=0.1,
            )
            time.sleep(1.5)  # a few more passes: nothing else may appear
            recorded = {p["name"]: p["provider_id"] for p in pods()}
            metrics = httpx.get(f"{url}/metrics").text
            fleet = httpx.get(f"{url}/v1/fleet", headers=auth).text
            refused = httpx.get(f"{url}/v1/fleet").status_code
        finally:
            second.send_signal(signal.SIGTERM)
            out, _ = second.communicate(timeout=30)
        seen = state.by_name()
        print(f"\nprovider view after restart: {seen}; recorded: {recorded}")
        assert all(len(ids) == 1 for ids in seen.values()), "duplicate pod"
        assert {n: ids[0] for n, ids in seen.items()} == recorded, "orphan or unrecorded pod"
        assert "fr-community-0-g0" in recorded  # the pod created before the crash was adopted
    redis = Redis()
    for key in redis.scan_iter(match=prefix + "*"):
        redis.delete(key)
    redis.close()
    text = log.read_text() + out + metrics + fleet
    assert "adopted" in log.read_text()
    assert KEY not in text and not state.key_in_url
    assert refused == 401
    private = [str(k.jwk["d"]) for k in keys]
    assert not any(d in text for d in private)
    for pod in state.pods.values():
        pod_env = json.dumps(pod.env)
        assert not any(d in pod_env for d in private) and "FRAMERELAY_SIGNING" not in pod_env
        assert "FRAMERELAY_WORKER_TLS_CERT_PEM" in pod.env
    assert state.violations == [] and state.client_errors == []
