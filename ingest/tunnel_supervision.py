"""Keep a tunnel client running, and the small waits its loop is made of.

:func:`supervise` runs :meth:`ingest.tunnel_client.TunnelClient.run` until
``stop``; should ``run`` ever end or raise anyway (it is built not to), the
error is logged and counted (``client.restarts``) and ``run`` starts again
after a capped, jittered backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import Protocol

from framerelay.backoff import Backoff

log = logging.getLogger("ingest.tunnel_client")


class Runnable(Protocol):
    url: str
    restarts: int

    async def run(self, stop: asyncio.Event) -> None: ...


async def supervise(client: Runnable, stop: asyncio.Event) -> None:
    """Run ``client`` until ``stop``. Should ``run`` ever end or raise anyway, log it,
    count it (``client.restarts``) and start it again with backoff."""
    backoff = Backoff(0.5, 10.0)
    rng = random.Random()  # noqa: S311 - jitter, not security
    while not stop.is_set():
        try:
            await client.run(stop)
        except Exception as exc:
            log.error("tunnel client for %s crashed; restarting it", client.url, exc_info=exc)
        else:
            if stop.is_set():
                return
            log.error("tunnel client for %s ended by itself; restarting it", client.url)
        client.restarts += 1
        await sleep_unless(stop, backoff.next_delay(rng))


async def sleep_unless(stop: asyncio.Event, delay_s: float) -> None:
    """Sleep ``delay_s``, or less when ``stop`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(delay_s):
            await stop.wait()


async def first_of(*events: asyncio.Event) -> None:
    """Wait until any of ``events`` is set."""
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
