"""``framerelay runpod check``: does the RunPod API key work, and what does RunPod offer?

The first command a RunPod user runs. It reads the same settings as the orchestrator
(``FRAMERELAY_ORCH_RUNPOD__API_KEY`` or ``..._API_KEY_FILE``, ``..._BASE_URL``; the key
is never taken on the command line) and only reads from RunPod's REST API v2, through
the provider's own client (:class:`deploy.providers.runpod.client.RunPodHttp`):

* ``GET /catalog/gpus?include=AVAILABILITY&product=POD`` once per cloud, with the CUDA
  floor of the settings, as the provider reads it before a create: VRAM, stock per
  cloud, list prices, the hosts' CUDA versions;
* ``GET /catalog/datacenters``, ``GET /network-volumes``;
* ``GET /serverless``: the endpoints this fleet manages (named ``<fleet>-...``, as its
  pods are; ``FRAMERELAY_ORCH_FLEET``).

Every request is sent once (a check reports what RunPod answers now; the orchestrator
retries). A failure is one line: a refused key (401/403) says where the key was read
from, an unreachable API names its URL. Exit codes: 0 the key works, 1 RunPod or the
network failed, 2 a setting is missing or wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import httpx

from framerelay.commands._orch_client import table
from framerelay.errors import ConfigError

if TYPE_CHECKING:
    from deploy.providers.base import ProviderError
    from deploy.providers.runpod.client import RunPodHttp
    from deploy.settings import RunPodSettings

HELP = "check the RunPod API key and list what RunPod offers (GPUs, stock, prices)"
KEY_ENV = "FRAMERELAY_ORCH_RUNPOD__API_KEY"
KEY_FILE_ENV = f"{KEY_ENV}_FILE"
URL_ENV = "FRAMERELAY_ORCH_RUNPOD__BASE_URL"
CLOUDS = ("SECURE", "COMMUNITY")
FAILURE = 1
_MAX_REASON = 160
_MIN_KEY_TO_REDACT = 8


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("runpod", help="RunPod: check the API key and the catalog", description=HELP)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    check = verbs.add_parser(
        "check",
        help=HELP,
        description=f"{HELP}. Reads only. The key comes from {KEY_ENV} or {KEY_FILE_ENV}, "
        "never from the command line.",
    )
    check.add_argument("--json", action="store_true", help="print what was read as JSON")
    check.set_defaults(func=_check)


@dataclass(frozen=True, slots=True)
class Survey:
    """What the check read, ready for JSON (the table shows the same)."""

    base_url: str
    key_from: str
    cuda_scope: str
    gpus: list[dict[str, Any]]
    data_centres: list[dict[str, Any]]
    network_volumes: list[dict[str, Any]]
    fleet: str
    endpoints: list[dict[str, Any]]
    other_endpoints: int
    """Serverless endpoints on the account that this fleet does not manage."""


class _Watch(httpx.AsyncBaseTransport):
    """httpx's transport, remembering what the last request met (its status, or the
    transport error that stopped it): how a failed read is explained."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.request = ""
        self.status: int | None = None
        self.failure: httpx.TransportError | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.request = f"{request.method} {request.url.path}"
        self.status, self.failure = None, None
        try:
            resp = await self._inner.handle_async_request(request)
        except httpx.TransportError as exc:
            self.failure = exc
            raise
        self.status = resp.status_code
        return resp

    async def aclose(self) -> None:
        await self._inner.aclose()


def _check(args: argparse.Namespace) -> int:
    from deploy.providers.base import ProviderError
    from deploy.settings import OrchestratorSettings

    settings = OrchestratorSettings()
    runpod = settings.runpod
    key = runpod.api_key.get_secret_value() if runpod.api_key is not None else ""
    if not key.strip():
        raise ConfigError(
            f"no RunPod API key: set {KEY_FILE_ENV} to a file holding it (or {KEY_ENV}); "
            "it is never taken on the command line"
        )
    once = runpod.model_copy(update={"max_retries": 0})
    watch = _Watch()
    try:
        survey = asyncio.run(_survey(once, settings.fleet, watch))
    except ProviderError as exc:
        line = _explain(exc, watch, runpod)
        print(f"framerelay: error: {_redact(line, key)}", file=sys.stderr, flush=True)
        return FAILURE
    text = json.dumps(asdict(survey), indent=2) if args.json else render(survey)
    print(_redact(text, key))
    return 0


async def _survey(settings: RunPodSettings, fleet: str, watch: _Watch) -> Survey:
    from deploy.providers.runpod.client import RunPodHttp

    http = RunPodHttp(settings, transport=watch)
    try:
        return await _read(http, settings, fleet)
    finally:
        await http.aclose()


async def _read(http: RunPodHttp, settings: RunPodSettings, fleet: str) -> Survey:
    """Every read of the check, one after the other (the last one's status explains a
    failure)."""
    catalog = {
        cloud: await http.pages(
            "/catalog/gpus", "gpus", "read the GPU catalog", _catalog_params(settings, cloud)
        )
        for cloud in CLOUDS
    }
    centres = await http.pages("/catalog/datacenters", "dataCenters", "list the data centres")
    volumes = await http.pages("/network-volumes", "networkVolumes", "list network volumes")
    endpoints = await http.pages("/serverless", "endpoints", "list serverless endpoints")
    ours = [e for e in endpoints if str(e.get("name", "")).startswith(f"{fleet}-")]
    return Survey(
        base_url=settings.base_url,
        key_from=_key_source(),
        cuda_scope=_cuda_scope(settings),
        gpus=gpu_types(catalog, settings),
        data_centres=[_centre(c) for c in centres],
        network_volumes=[_volume(v) for v in volumes],
        fleet=fleet,
        endpoints=[_endpoint(e) for e in ours],
        other_endpoints=len(endpoints) - len(ours),
    )


def _catalog_params(settings: RunPodSettings, cloud: str) -> dict[str, str]:
    """The catalog read of one cloud, one GPU, scoped to the hosts the settings accept
    (as :class:`deploy.providers.runpod.catalog.Catalog` reads it)."""
    params = {"include": "AVAILABILITY", "product": "POD", "cloud": cloud, "count": "1"}
    if settings.allowed_cuda_versions:
        params["cudaVersions"] = ",".join(settings.allowed_cuda_versions)
    elif settings.min_cuda_version:
        params["minCudaVersion"] = settings.min_cuda_version
    return params


def _cuda_scope(settings: RunPodSettings) -> str:
    if settings.allowed_cuda_versions:
        return f"hosts with CUDA {', '.join(settings.allowed_cuda_versions)}"
    if settings.min_cuda_version:
        return f"hosts with CUDA >= {settings.min_cuda_version}"
    return "every host"


def _key_source() -> str:
    """Where the key was read from (the variable, and the file's path), never the key."""
    path = os.environ.get(KEY_FILE_ENV)
    return f"{KEY_FILE_ENV} ({path})" if path else KEY_ENV


def _cuda_key(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError:
        return ()


def gpu_types(
    catalog: Mapping[str, list[dict[str, Any]]], settings: RunPodSettings
) -> list[dict[str, Any]]:
    """One entry per GPU type of the per-cloud reads: VRAM, list prices, stock per cloud
    (None: not sold there), CUDA versions (true: a host has room), smallest first."""
    from deploy.providers.runpod.catalog import parse_offer

    merged: dict[str, dict[str, Any]] = {}
    for cloud, raws in catalog.items():
        for raw in raws:
            offer = parse_offer(raw, settings)
            if offer is None:
                continue
            entry = merged.setdefault(offer.gpu_type, _gpu_entry(raw, offer.memory_gb))
            entry["price_per_hr"].update(
                secure=offer.price.secure,
                community=offer.price.community,
                serverless=offer.price.serverless,
            )
            entry["stock"][cloud] = offer.stock if cloud in offer.clouds else None
            for v in raw.get("cudaVersions") or []:
                if isinstance(v, dict) and isinstance(v.get("version"), str):
                    free = entry["cuda_versions"].get(v["version"], False)
                    entry["cuda_versions"][v["version"]] = free or v.get("available") is True
    for entry in merged.values():
        cuda = entry["cuda_versions"]
        entry["cuda_versions"] = {v: cuda[v] for v in sorted(cuda, key=_cuda_key)}
    return sorted(merged.values(), key=lambda e: (e["memory_gb"], e["id"]))


def _gpu_entry(raw: Mapping[str, Any], memory_gb: float) -> dict[str, Any]:
    return {
        "id": raw["id"],
        "name": str(raw.get("name") or raw["id"]),
        "memory_gb": memory_gb,
        "price_per_hr": {},
        "stock": dict.fromkeys(CLOUDS),
        "cuda_versions": {},
    }


def _centre(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": str(raw.get("id", "")),
        "name": str(raw.get("name", "")),
        "region": str(raw.get("region", "")),
        "network_volume_types": [str(t) for t in raw.get("networkVolumeTypes") or []],
        "global_network": raw.get("globalNetwork") is True,
    }


def _volume(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": str(raw.get("id", "")),
        "name": str(raw.get("name", "")),
        "size_gb": raw.get("size"),
        "data_centre": str(raw.get("dataCenter", "")),
        "type": str(raw.get("type", "")),
    }


def _endpoint(raw: Mapping[str, Any]) -> dict[str, Any]:
    """An endpoint without its env (it may hold secrets)."""
    gpu = raw.get("gpu")
    gpu = gpu if isinstance(gpu, dict) else {}
    workers = raw.get("workers")
    workers = workers if isinstance(workers, dict) else {}
    return {
        "id": str(raw.get("id", "")),
        "name": str(raw.get("name", "")),
        "type": str(raw.get("type", "")),
        "gpu_pools": [str(p) for p in gpu.get("pools") or []],
        "workers_min": workers.get("min"),
        "workers_max": workers.get("max"),
        "idle_timeout_s": workers.get("idleTimeout"),
        "data_centres": [str(d) for d in raw.get("dataCenterIds") or []],
    }


def render(survey: Survey) -> str:
    """The check's report: the key line, then one table per kind of thing read."""
    parts = [
        f"RunPod API key works: {survey.base_url} answered every read (key from {survey.key_from})",
        f"\nGPU types for pods ($/h per GPU; stock of 1 GPU on {survey.cuda_scope}):",
        _gpu_table(survey.gpus),
        f"\nData centres ({len(survey.data_centres)}):",
        _centre_table(survey.data_centres),
        f"\nNetwork volumes ({len(survey.network_volumes)}):",
        _volume_table(survey.network_volumes),
        f"\nServerless endpoints of fleet {survey.fleet!r} (named {survey.fleet}-...): "
        f"{len(survey.endpoints)} ({survey.other_endpoints} other endpoint(s) on the account "
        "not shown)",
        _endpoint_table(survey.endpoints),
    ]
    return "\n".join(p for p in parts if p)


def _money(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, int | float) else "-"


def _cuda_cell(versions: Mapping[str, bool]) -> str:
    if not versions:
        return "-"
    return ", ".join(v if free else f"{v} (full)" for v, free in versions.items())


def _gpu_table(gpus: list[dict[str, Any]]) -> str:
    if not gpus:
        return "  none listed"
    rows = [
        (
            g["id"],
            f"{g['memory_gb']:g}",
            *(g["stock"][c] or "not sold" for c in CLOUDS),
            _money(g["price_per_hr"].get("secure")),
            _money(g["price_per_hr"].get("community")),
            _money(g["price_per_hr"].get("serverless")),
            _cuda_cell(g["cuda_versions"]),
        )
        for g in gpus
    ]
    header = (
        "GPU TYPE",
        "VRAM GB",
        "STOCK SECURE",
        "STOCK COMMUNITY",
        "$/H SECURE",
        "$/H COMMUNITY",
        "$/H SERVERLESS",
        "CUDA",
    )
    return table(rows, header)


def _centre_table(centres: list[dict[str, Any]]) -> str:
    if not centres:
        return "  none listed"
    rows = [
        (
            c["id"],
            c["name"],
            c["region"],
            ", ".join(c["network_volume_types"]) or "-",
            "yes" if c["global_network"] else "no",
        )
        for c in centres
    ]
    return table(rows, ("ID", "NAME", "REGION", "VOLUME TYPES", "GLOBAL NETWORK"))


def _volume_table(volumes: list[dict[str, Any]]) -> str:
    if not volumes:
        return "  none"
    rows = [(v["id"], v["name"], v["size_gb"], v["data_centre"], v["type"]) for v in volumes]
    return table(rows, ("ID", "NAME", "SIZE GB", "DATA CENTRE", "TYPE"))


def _endpoint_table(endpoints: list[dict[str, Any]]) -> str:
    if not endpoints:
        return ""
    rows = [
        (
            e["id"],
            e["name"],
            e["type"],
            ", ".join(e["gpu_pools"]) or "-",
            f"{e['workers_min']}-{e['workers_max']}",
            e["idle_timeout_s"] if e["idle_timeout_s"] is not None else "-",
            ", ".join(e["data_centres"]) or "any",
        )
        for e in endpoints
    ]
    header = ("ID", "NAME", "TYPE", "GPU POOLS", "WORKERS", "IDLE S", "DATA CENTRES")
    return table(rows, header)


def _explain(exc: ProviderError, watch: _Watch, settings: RunPodSettings) -> str:
    """One line for a failed read: the key refused, the API out of reach, or the
    provider client's own line (a 5xx, a 429, an answer that is not RunPod's)."""
    url = settings.base_url
    if watch.failure is not None:
        return _unreachable(watch.failure, url, settings.timeout_s)
    if watch.status == 401:
        return (
            f"RunPod at {url} refused the API key (HTTP 401): check the key in "
            f"{_key_source()}; it may be mistyped, revoked or from another account"
        )
    if watch.status == 403:
        return (
            f"RunPod at {url} refused the API key (HTTP 403) for {watch.request}: check the key in "
            f"{_key_source()}; give it read access to the catalog, network volumes and "
            "serverless endpoints (and read/write to pods for the orchestrator)"
        )
    return str(exc)


def _unreachable(failure: httpx.TransportError, url: str, timeout_s: float) -> str:
    if isinstance(failure, httpx.TimeoutException):
        why = f"no answer within {timeout_s:g} s"
    else:
        detail = " ".join(str(failure).split())[:_MAX_REASON]
        why = f"{type(failure).__name__}: {detail}" if detail else type(failure).__name__
    return (
        f"cannot reach RunPod's API at {url} ({why}): check the network, and {URL_ENV} if it is set"
    )


def _redact(text: str, key: str) -> str:
    """``text`` without the key, should RunPod ever echo it (a key too short to tell from
    ordinary text is no key RunPod issues, and is left alone)."""
    return text.replace(key, "***") if len(key) >= _MIN_KEY_TO_REDACT else text
