"""Issue 10: ``framerelay.client.subscribe`` over ``wss://`` with a CA file (and mTLS).

The README's ``subscribe("wss://...")`` raised ``ValueError: ssl=None is
incompatible with a wss:// URI``. Now a CA file (or an ``ssl`` context)
verifies the hub, results arrive, and a certificate that does not verify is
a one-line :class:`ConfigError` at once, not a retry loop or a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from bench.rig.records import result_record
from framerelay.client import SubscribeState, subscribe, tls_context
from framerelay.errors import ConfigError
from framerelay.schemas import ResultMessage
from ingest.bus import ResultBus
from ingest.hub import ResultHub
from ingest.settings import IngestSettings, ResultsSettings
from tests.conftest import TIMEOUT_FACTOR
from tests.support.auth import mint
from tests.support.ingest_api import Pki, make_pki
from tests.support.results_hub import hub_guard, serving

SECRET = "a-single-host-secret-long-enough"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@contextlib.asynccontextmanager
async def tls_hub(pki: Pki, *, mtls: bool = False) -> AsyncIterator[str]:
    """A hub over WSS publishing cam-1 results every 10 ms; yields its wss:// URL."""
    bus = ResultBus()
    hub = ResultHub(bus, guard=hub_guard(SECRET), registry=CollectorRegistry())
    settings = IngestSettings(
        api_port=0, results=ResultsSettings(ping_interval_s=0), api_tls_cert=pki.cert,
        api_tls_key=pki.key, api_tls_client_ca=pki.ca if mtls else None,
    )  # fmt: skip

    async def feed() -> None:
        for i in range(100_000):
            bus.publish(result_record("cam-1", i).model_copy(update={"received_at": time.time()}))
            await asyncio.sleep(0.01)

    async with serving(hub, settings) as url:
        task = asyncio.create_task(feed())
        try:
            yield url
        finally:
            task.cancel()


def _token() -> str:
    return mint(SECRET, ["results:cam-1"], "ingest", sub="app")


async def _take(
    url: str, n: int, state: SubscribeState | None = None, timeout_s: float = 15, **tls: Any
) -> list[int]:
    got: list[int] = []
    # subscribe() is an async generator (declared as an AsyncIterator): it can be aclosed
    results = cast("AsyncGenerator[ResultMessage, None]",
                   subscribe(url, streams=["cam-1"], token=_token, state=state,
                             reconnect_max_s=0.5, **tls))  # fmt: skip
    async with asyncio.timeout(timeout_s * TIMEOUT_FACTOR), contextlib.aclosing(results):
        async for result in results:
            got.append(result.seq)
            if len(got) == n:
                break
    return got


async def test_results_over_wss_with_a_ca_file(pki: Pki) -> None:
    async with tls_hub(pki) as url:
        assert url.startswith("wss://")
        got = await _take(url, 20, ca_file=pki.ca)
    assert len(got) == 20 and got == sorted(got)


async def _one_line_error(pki: Pki, **tls: Any) -> tuple[str, float, SubscribeState]:
    state = SubscribeState()
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        async with tls_hub(pki) as url:
            await _take(url, 1, state, **tls)
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no chained trace
    return str(info.value), time.monotonic() - started, state


async def test_a_wrong_ca_is_a_one_line_error_at_once(pki: Pki) -> None:
    message, elapsed, state = await _one_line_error(pki, ca_file=pki.other_ca)
    assert "\n" not in message and "does not verify" in message and "ca_file" in message
    assert "certificate verify failed" in message or "unable to get local issuer" in message
    assert state.connects == 0 and elapsed < 10 * TIMEOUT_FACTOR  # no retry loop


async def test_wss_without_a_ca_file_no_longer_raises_value_error(pki: Pki) -> None:
    """The README's subscribe("wss://...") without TLS arguments: system CAs are used (they do
    not know this private CA: a clear ConfigError, not ``ValueError: ssl=None ...``)."""
    message, _, _ = await _one_line_error(pki)
    assert "does not verify" in message and "\n" not in message


async def test_mtls_with_and_without_a_client_certificate(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    async def main(timeout_s: float, **tls: Any) -> list[int]:
        async with tls_hub(pki, mtls=True) as url:
            return await _take(url, 5, timeout_s=timeout_s, **tls)

    got = await main(15, ca_file=pki.ca, client_cert=pki.client_cert, client_key=pki.client_key)
    assert len(got) == 5
    with pytest.raises(TimeoutError):  # refused by the hub's TLS: no result, ever
        await main(2, ca_file=pki.ca)

    assert "pass client_cert=" in caplog.text


def test_tls_options_are_checked_before_connecting(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="need a wss:// URL"):
        tls_context("ws://h/v1/results", ca_file=pki.ca)
    with pytest.raises(ConfigError, match=r"nope\.pem"):
        tls_context("wss://h/v1/results", ca_file=tmp_path / "nope.pem")
    with pytest.raises(ConfigError, match="not a usable PEM"):
        tls_context("wss://h/v1/results", ca_file=pki.ca, client_cert=pki.ca)
    with pytest.raises(ConfigError, match="client_key needs client_cert"):
        tls_context("wss://h/v1/results", client_key=pki.client_key)
    assert tls_context("ws://h/v1/results") is None
    assert tls_context("wss://h/v1/results") is not None  # system CAs
