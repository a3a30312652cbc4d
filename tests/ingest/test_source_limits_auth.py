"""A camera that refuses the credentials (401/403) is AUTH_FAILED, retried slowly.

FFmpeg reports a 401 as ``av.error.HTTPUnauthorizedError`` and a 403 as
``av.error.HTTPForbiddenError`` for RTSP and HTTP alike (checked here against
a real responder on 127.0.0.1). Such a camera is retried every
``auth_retry_s`` (not at the reconnect backoff, which could lock the account)
and never shows the password; a healthy stream beside it is untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from itertools import pairwise

import pytest

from ingest.settings import StreamConfig
from ingest.source import SizeRefused, SourceAuthFailed
from ingest.stream import StreamState
from tests.conftest import TIMEOUT_FACTOR
from tests.support.harness import standalone
from tests.support.media import Media
from tests.support.scripted_source import DOWN, NET, Hooks, Scripted, source_runner
from tests.support.waiting import wait_until_async

PASSWORD = "pa55-w0rd-never-shown"
AUTH_RETRY_S = 0.6
REASONS = {401: "Unauthorized", 403: "Forbidden"}


class Refuser:
    """Answers every RTSP or HTTP request with ``code`` (and a Basic challenge)."""

    def __init__(self, code: int) -> None:
        self.code = code
        self.connections: list[float] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.append(time.monotonic())
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                first, *lines = head.decode("latin-1").split("\r\n")
                proto = "RTSP/1.0" if first.endswith("RTSP/1.0") else "HTTP/1.1"
                cseq = next((ln for ln in lines if ln.lower().startswith("cseq:")), "CSeq: 1")
                answer = (
                    f"{proto} {self.code} {REASONS[self.code]}\r\n{cseq}\r\n"
                    'WWW-Authenticate: Basic realm="camera"\r\nContent-Length: 0\r\n\r\n'
                )
                writer.write(answer.encode())
                await writer.drain()
        writer.close()


def attempts(connections: list[float]) -> list[float]:
    """Connection times grouped into attempts (over HTTP, FFmpeg reconnects at once to answer
    the challenge with the credentials)."""
    starts = connections[:1]
    for a, b in pairwise(connections):
        if b - a > AUTH_RETRY_S / 3:
            starts.append(b)
    return starts


@contextlib.asynccontextmanager
async def refusing(code: int) -> AsyncIterator[tuple[Refuser, int]]:
    refuser = Refuser(code)
    server = await asyncio.start_server(refuser.handle, "127.0.0.1", 0)
    try:
        yield refuser, server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(("scheme", "code"), [("rtsp", 401), ("rtsp", 403), ("http", 401)])
async def test_refused_credentials_are_auth_failed_and_retried_slowly(
    media: Media, scheme: str, code: int
) -> None:
    async with refusing(code) as (refuser, port):
        cam = StreamConfig(
            id="cam",
            url=f"{scheme}://127.0.0.1:{port}/cam",
            username="admin",
            password=PASSWORD,
            auth_retry_s=AUTH_RETRY_S,
            reconnect_initial_s=0.05,
            reconnect_max_s=0.05,
            open_timeout_s=3,
        )
        good = StreamConfig(id="good", url=str(media.short("mp4")), fps=5, realtime=True, loop=True)
        started = time.monotonic()
        async with standalone(good) as (ok, got), standalone(cam) as (bad, _):
            await wait_until_async(
                lambda: bad.state is StreamState.AUTH_FAILED, 5, "AUTH_FAILED", every_s=0.02
            )
            seen = time.monotonic()
            await wait_until_async(lambda: bad.counters["auth_failed"] >= 4, 10, "4 auth failures")
            sent_before = len(got)
            await asyncio.sleep(0.5)
            assert len(got) > sent_before, "the healthy stream must keep going"
            assert ok.state is StreamState.RUNNING and ok.error is None
        after_s = seen - started
    gaps = [b - a for a, b in pairwise(attempts(refuser.connections))]
    print(
        f"\n{scheme} {code}: AUTH_FAILED after {after_s:.2f} s, {bad.counters['auth_failed']} "
        f"failures, {len(refuser.connections)} connections, gaps "
        f"{', '.join(f'{g:.2f}' for g in gaps)} s (auth_retry_s {AUTH_RETRY_S}, backoff 0.05)"
        f"\n  error: {bad.error}"
    )
    assert bad.error is not None and bad.error.startswith("authentication failed")
    assert str(code) in bad.error and PASSWORD not in bad.error
    assert all(PASSWORD not in str(h["reason"]) for h in bad.history)
    assert bad.counters["open_error"] == 0 and bad.retry_delay_s == AUTH_RETRY_S
    assert bad.counters["auth_failed"] == bad.counters["reconnects"] >= 4
    assert len(gaps) >= 3 and min(gaps) >= AUTH_RETRY_S * 0.9
    assert max(gaps) < AUTH_RETRY_S + 2 * TIMEOUT_FACTOR
    assert ok.counters["decoded"] > 0 and ok.counters["auth_failed"] == 0


def test_runner_waits_auth_retry_s_after_a_refusal_and_never_retries_a_refused_size() -> None:

    refused = SourceAuthFailed("authentication failed: rtsp://cam/x: 401")
    source, hooks = Scripted(NET, [refused, DOWN, refused, 3]), Hooks(frame_limit=3)
    source_runner(source, hooks, auth_retry_s=0.02).run()
    assert hooks.retries == [
        ("SourceAuthFailed", 0.02),
        ("SourceUnavailable", 0.001),  # the backoff did not grow on the auth failure
        ("SourceAuthFailed", 0.02),
    ]
    assert source.released == 4  # every session, failed or not, releases its memory
    tiny = Scripted(NET, [SizeRefused("1x1 is smaller than min_width x min_height")])
    with pytest.raises(SizeRefused):
        source_runner(tiny, Hooks()).run()
    assert tiny.sessions == 1
