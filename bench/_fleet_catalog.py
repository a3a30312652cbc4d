"""The fleet benches' prices: RunPod's GPU catalog as the v2 contract server serves it,
read through the provider's own catalog.

RunPod sells a GPU type on its **secure** cloud (RunPod's data centres), on its
**community** cloud (hosts of third parties: cheaper, less reliable, may have no public
IP) and on **serverless** endpoints (workers that scale to zero, billed per second);
``GET /v2/catalog/gpus`` lists the three prices per GPU type (``price.secure``,
``price.community``, ``price.serverless``). It has no spot or interruptible pods (RunPod
dropped them in May 2026), so the benches price nothing as spot.

:func:`read_catalog` asks :class:`deploy.providers.runpod.provider.RunPodProvider` for
its prices (``GET /v2/catalog/gpus``, :mod:`deploy.providers.runpod.catalog`) from
:class:`bench.rig.runpod_v2_contract.ContractServer` in this process (an ASGI
transport: no port, no thread), every request and answer checked against RunPod's
schema. The prices are the contract server's illustrative ones (:data:`GPUS`), shaped
as RunPod's catalog shapes them. ``bench/fleet.py``'s day reads them the same way over
real HTTP, from the server its fleet rents from.
"""

from __future__ import annotations

import asyncio
import secrets

import httpx
from pydantic import SecretStr

from bench.rig.runpod_v2_contract import ContractServer, create_app
from deploy.providers.base import GpuPrice
from deploy.providers.runpod.provider import RunPodProvider
from deploy.settings import RunPodSettings

BASE_URL = "http://127.0.0.1/v2"
"""Where the provider thinks the in-process server is (loopback: plain HTTP allowed)."""


async def catalog_prices(provider: RunPodProvider) -> dict[str, GpuPrice]:
    """The provider's list prices per GPU type; an error when the catalog said nothing
    (the provider logs and returns what it knew, which is nothing on a first read)."""
    prices = await provider.prices()
    if not prices or any(p.serverless is None for p in prices.values()):
        raise RuntimeError(f"RunPod's catalog gave no full prices: {prices!r}")
    return prices


async def _read() -> dict[str, GpuPrice]:
    key = "bench-" + secrets.token_hex(8)
    server = ContractServer(key)
    transport = httpx.ASGITransport(app=create_app(server))
    settings = RunPodSettings(api_key=SecretStr(key), base_url=BASE_URL)
    provider = RunPodProvider(settings, transport=transport)
    try:
        prices = await catalog_prices(provider)
    finally:
        await provider.aclose()
        server.close()
    problems = server.violations + server.client_errors
    if problems:
        raise RuntimeError(f"the catalog read broke RunPod's schema: {problems}")
    return prices


def read_catalog() -> dict[str, GpuPrice]:
    """GPU type -> its secure, community and serverless $ per GPU-hour, as RunPod's
    catalog (the contract server's) lists them, read through the provider."""
    return asyncio.run(_read())
