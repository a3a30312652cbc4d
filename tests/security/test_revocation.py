"""Per-token revocation (issue 28): a revoked token is refused at once, and the long-lived
sessions it opened (a results WebSocket, the console's event streams) end within seconds
instead of running to the token's expiry.

A real ``framerelay ingest`` process reads ``FRAMERELAY_REVOKED_TOKENS_FILE``;
``framerelay token revoke`` (a subprocess, as an operator runs it) appends to it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import jwt
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from framerelay.auth import KeySet
from framerelay.auth.revocation import RevocationList, parse
from framerelay.errors import ConfigError
from tests.conftest import TIMEOUT_FACTOR
from tests.security.procs import Service, bearer, run_cli, spawn, wait_healthy
from tests.support.auth import ed_keys, mint
from tests.support.servers import free_port

pytestmark = pytest.mark.integration
RECHECK_S = 2.0  # the hub's and the console's
MANY = "1000000"


@dataclass
class Ingest:
    svc: Service
    keys: KeySet
    revoked: Path


@pytest.fixture
def ingest(tmp_path: Path) -> Iterator[Ingest]:
    keys = ed_keys("revocation")
    keys_file = tmp_path / "signing.jwks"
    keys_file.write_text(keys.to_json())
    keys_file.chmod(0o600)
    revoked = tmp_path / "revoked.txt"
    revoked.write_text("# revoked tokens\n")
    port = free_port()
    env = {
        "FRAMERELAY_SIGNING_KEYS_FILE": str(keys_file),
        "FRAMERELAY_REVOKED_TOKENS_FILE": str(revoked),
        "FRAMERELAY_INGEST_AUTH_MAX_FAILURES": MANY,
        "FRAMERELAY_INGEST_STORE_PATH": str(tmp_path / "streams.json"),
    }
    args = ["ingest", "--api-port", str(port), "--worker-url", "ws://127.0.0.1:9/v1/tunnel"]
    svc = spawn("ingest", args, env, tmp_path / "logs")
    try:
        wait_healthy(svc, f"http://127.0.0.1:{port}")
        yield Ingest(svc, keys, revoked)
    finally:
        svc.stop()


def _revoke(ingest: Ingest, *how: str) -> None:
    done = run_cli(["token", "revoke", "--list", str(ingest.revoked), *how], {})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("revoked ") and "eyJ" not in done.stdout  # never the token


async def _closed_by_revocation(ws_url: str, token: str, revoke: object) -> tuple[int, str]:
    """Subscribe, revoke (``revoke()``), then the close code and the last message."""
    async with connect(ws_url, additional_headers=bearer(token), proxy=None) as ws:
        first = json.loads(await asyncio.wait_for(ws.recv(), 10 * TIMEOUT_FACTOR))
        assert first["type"] == "subscribed"
        await asyncio.to_thread(revoke)  # type: ignore[arg-type]
        last = ""
        try:
            async with asyncio.timeout((RECHECK_S + 10) * TIMEOUT_FACTOR):
                async for message in ws:
                    last = str(message)
        except ConnectionClosed:
            pass
        assert ws.close_code is not None, "the session outlived its revoked token"
        return ws.close_code, last


async def test_a_revoked_token_ends_its_results_session_and_is_refused(
    ingest: Ingest, tmp_path: Path
) -> None:
    token = mint(ingest.keys, ["results:cam-1"], "ingest", ttl=3600, sub="lobby-app")
    other = mint(ingest.keys, ["results:cam-1"], "ingest", ttl=3600, sub="lobby-app")
    token_file = tmp_path / "app.token"
    token_file.write_text(token + "\n")
    url = ingest.svc.url.replace("http", "ws", 1) + "/v1/results?stream=cam-1"
    code, last = await _closed_by_revocation(
        url, token, lambda: _revoke(ingest, "--token-file", str(token_file))
    )
    assert code == 4401
    said = json.loads(last)
    assert said["code"] == "unauthorized" and "revoked" in said["message"]
    jti = jwt.decode(token, options={"verify_signature": False})["jti"]
    assert f"jti:{jti}" in ingest.revoked.read_text()

    async def again(tok: str) -> int:
        try:
            async with connect(url, additional_headers=bearer(tok), proxy=None):
                return 101
        except InvalidStatus as exc:
            return exc.response.status_code

    assert await again(token) == 401
    assert await again(other) == 101  # another token of the same holder still works


def test_revoking_a_holder_ends_its_console_stream(ingest: Ingest) -> None:
    token = mint(ingest.keys, ["streams:read"], "ingest", ttl=3600, sub="night-shift")
    events: list[str] = []
    with (
        httpx.Client(timeout=(RECHECK_S + 20) * TIMEOUT_FACTOR) as http,
        http.stream("GET", f"{ingest.svc.url}/v1/console/streams", headers=bearer(token)) as resp,
    ):
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("event:"):
                events.append(line.removeprefix("event:").strip())
                if events.count("streams") == 1:
                    _revoke(ingest, "--sub", "night-shift")
            if line.startswith("data:") and events and events[-1] == "expired":
                assert "revoked" in line
                break
    assert events[-1] == "expired"
    refused = httpx.get(f"{ingest.svc.url}/v1/streams", headers=bearer(token), timeout=20)
    assert refused.status_code == 401 and "revoked" in refused.json()["detail"]


def test_the_file_is_read_again_only_when_it_changed_and_a_broken_edit_keeps_the_list(
    tmp_path: Path,
) -> None:
    path = tmp_path / "revoked.txt"
    path.write_text("jti:aaa\n")
    now = [0.0]
    listed = RevocationList(path, check_s=1.0, clock=lambda: now[0])
    assert listed.reason("aaa", "x") == "its id is revoked"
    path.write_text("jti:aaa\nsub:bob\n")
    assert listed.reason("zzz", "bob") is None  # not looked at again yet
    now[0] = 1.5
    assert listed.reason("zzz", "bob") == "every token of 'bob' is revoked"
    path.write_text("jti:aaa\nsub:bob\nnonsense here\n")
    now[0] = 3.0
    assert listed.reason("zzz", "bob") is not None  # the broken edit keeps what was revoked
    path.unlink()
    now[0] = 4.5
    assert listed.reason("aaa", "x") is not None


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("token:abc\n", "line 1"),
        ("# ok\njti:\n", "line 2"),
        ("jti:a b\n", "line 1"),
        ("abc\n", "line 1"),
    ],
)
def test_a_bad_line_is_named(text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        parse(text, "revoked.txt")


def test_a_missing_file_at_start_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        RevocationList(tmp_path / "nope.txt")
