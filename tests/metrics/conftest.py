"""Fixtures of the metrics tests."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import httpx
import pytest

from tests.support.auth import ed_keys
from tests.support.servers import free_port
from tests.support.service_processes import BASE_ENV, drop_keys, end_process, spawn, wait_http


@pytest.fixture(scope="module")
def orchestrator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("orch")
    keys_file = tmp / "signing.jwks"
    keys_file.write_text(ed_keys().to_json())
    keys_file.chmod(0o600)
    port, prefix = free_port(), f"test-promtool-orch-{os.getpid()}:"
    env = {
        **BASE_ENV,
        "FRAMERELAY_SIGNING_KEYS_FILE": str(keys_file),
        "FRAMERELAY_ORCH_KEY_PREFIX": prefix,
        "FRAMERELAY_ORCH_CA_DIR": str(tmp / "ca"),
        "FRAMERELAY_ORCH_TIERS": json.dumps([{"name": "ondemand", "max_workers": 0}]),
        "FRAMERELAY_ORCH_TICK_S": "0.2",
    }
    proc = spawn(["orchestrator", "--port", str(port)], env, tmp / "orchestrator.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/healthz", "the orchestrator", tmp / "orchestrator.log")
        httpx.get(f"{base}/v1/fleet")  # one refusal: auth_refused has a sample
        yield base
    finally:
        end_process(proc)
        drop_keys(prefix)
