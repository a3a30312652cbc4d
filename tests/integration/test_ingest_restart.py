"""Acceptance 6: streams added over REST survive an ingest restart (file store and Redis).

Real ``framerelay ingest`` processes; no worker is needed (streams decode and
report state while the tunnel keeps retrying).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import FILE_ROOTS_ENV, ROOT, TIMEOUT_FACTOR
from tests.support.auth import mint
from tests.support.fixtures import media  # noqa: F401 - fixture
from tests.support.media import Media
from tests.support.servers import RedisServer, free_port

pytestmark = pytest.mark.integration


class IngestProcess:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        token = mint(env["FRAMERELAY_TOKEN_SECRETS"], ["streams:read", "streams:write"], "ingest",
                     ttl=600)  # fmt: skip
        self.auth = {"Authorization": f"Bearer {token}"}
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> IngestProcess:
        worker = f"ws://127.0.0.1:{free_port()}/v1/tunnel"  # nobody there
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "framerelay", "ingest", "--worker-url", worker,
             "--api-port", str(self.port)],
            env=self.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 30 * TIMEOUT_FACTOR
        while True:
            try:
                if httpx.get(f"{self.base}/healthz").status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"ingest did not start: {self.stop()[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> str:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=30)
        return out

    def streams(self) -> dict[str, dict[str, Any]]:
        return {s["id"]: s for s in httpx.get(f"{self.base}/v1/streams", headers=self.auth).json()}


@pytest.fixture(params=["file", "redis"])
def env(request: pytest.FixtureRequest, tmp_path: Path, secret: str) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAMERELAY_")}
    env["FRAMERELAY_TOKEN_SECRETS"] = secret
    env[FILE_ROOTS_ENV] = os.environ[FILE_ROOTS_ENV]  # the test clips, added over the API
    if request.param == "file":
        env["FRAMERELAY_INGEST_STORE_PATH"] = str(tmp_path / "streams.json")
        yield env
        return
    redis = RedisServer(tmp_path / "redis").start()
    env["FRAMERELAY_REDIS_URL"] = redis.url
    try:
        yield env
    finally:
        redis.stop()


def test_two_of_three_streams_come_back_after_a_restart(
    env: dict[str, str],
    media: Media,  # noqa: F811
) -> None:
    clip = str(media.short("ts"))
    defs = {
        sid: {"id": sid, "url": clip, "fps": fps, "realtime": True, "loop": True}
        for sid, fps in (("cam-1", 5), ("cam-2", 2), ("cam-3", 1))
    }
    first = IngestProcess(env).start()
    try:
        for body in defs.values():
            r = httpx.post(f"{first.base}/v1/streams", json=body, headers=first.auth)
            assert r.status_code == 201, r.text
        assert httpx.delete(f"{first.base}/v1/streams/cam-2", headers=first.auth).status_code == 204
        assert set(first.streams()) == {"cam-1", "cam-3"}
    finally:
        out = first.stop()
    assert first.proc is not None and first.proc.returncode == 0, out[-2000:]

    second = IngestProcess(env).start()
    try:
        deadline = time.monotonic() + 15 * TIMEOUT_FACTOR
        while True:
            streams = second.streams()
            if (
                all(s["state"] == "RUNNING" for s in streams.values())
                or time.monotonic() > deadline
            ):
                break
            time.sleep(0.2)
        assert set(streams) == {"cam-1", "cam-3"}
        assert {s["state"] for s in streams.values()} == {"RUNNING"}
        for sid in streams:
            config = httpx.get(f"{second.base}/v1/streams/{sid}", headers=second.auth).json()[
                "config"
            ]
            assert {k: config[k] for k in defs[sid]} == defs[sid]
    finally:
        out = second.stop()
    assert second.proc is not None and second.proc.returncode == 0, out[-2000:]
