"""The ``runpod`` provider: RunPod REST API v1 (``https://rest.runpod.io/v1``).

Calls: ``POST /pods``, ``GET /pods``, ``GET /pods/{id}``,
``POST /pods/{id}/stop``, ``POST /pods/{id}/start``, ``DELETE /pods/{id}``.
The API key travels only in the ``Authorization: Bearer`` header: never in a
URL, a log line, an exception or a metric.

Creating walks the tier's options in order - GPU type, then cloud type, then
data centre - and moves to the next option on "no capacity" (RunPod answers
that a create cannot be placed). 429 and 5xx are retried with exponential
backoff and jitter (``Retry-After`` honoured); other 4xx are configuration
errors and stop at once.

A pod of ``gpu_count`` > 1 exposes one TCP port per GPU (``8443``, ``8444``, ...) and
starts ``framerelay worker --gpus N`` (``dockerStartCmd``): one worker per GPU. With
a tier's ``template_id`` the body names the template (``templateId``) and leaves out
what the template supplies (``imageName``, ``containerDiskInGb``); the pod's own env,
GPUs and ports are still sent.

A tier's ``volume`` (a RunPod network volume) goes in the body as ``networkVolumeId``
and ``volumeMountPath``; a network volume lives in one data centre and a pod that
mounts it runs there, so the create asks for that data centre only (``dataCenterIds``).
The pod's workers get their artefact cache on it
(``FRAMERELAY_WORKER_DETECTOR__CACHE_DIR=<mount>/framerelay/cache``, unless the pod's
env says otherwise) and ``FRAMERELAY_WORKER_VOLUME_DIR=<mount>`` (any volume): they take
a file from it only as the volume's signed manifest lists it, so the first pod of a GPU
type builds the engines, and the next read them once an operator has signed them.

The pod's env carries what :mod:`deploy.pod_trust` gives it: the public key
set, and with ``tls`` (the default) its own certificate and key
(``FRAMERELAY_WORKER_TLS_CERT_PEM`` / ``..._KEY_PEM``); its tunnel is then
``wss://`` and verified as ``<pod>.pods.framerelay``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import httpx

from deploy.models import Endpoint, PodInfo, PodSpec, PodStatus, tls_server_name
from deploy.providers.base import GpuPrice, NoCapacityError, ProviderError
from deploy.settings import VOLUME_ENV, RunPodSettings
from framerelay.backoff import Backoff
from framerelay.errors import ConfigError

log = logging.getLogger(__name__)
_NO_CAPACITY = ("no longer any instances available", "no instances available", "no capacity")
_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_MAX_RETRY_AFTER_S = 30.0


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _message(resp: httpx.Response) -> str:
    """The server's error text (truncated); never request headers."""
    try:
        body = resp.json()
        text = (
            str(body.get("error") or body.get("message") or body)
            if isinstance(body, dict)
            else str(body)
        )
    except ValueError:
        text = resp.text
    return text.strip()[:300]


def _float(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


class RunPodProvider:
    name = "runpod"

    def __init__(
        self, settings: RunPodSettings, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        if settings.api_key is None or not settings.api_key.get_secret_value():
            raise ConfigError(
                "the runpod provider needs an API key: set FRAMERELAY_ORCH_RUNPOD__API_KEY"
            )
        self.settings = settings
        self._client = httpx.AsyncClient(
            base_url=settings.base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {settings.api_key.get_secret_value()}"},
            timeout=settings.timeout_s,
            transport=transport,
        )
        self._prices: dict[str, GpuPrice] = {}
        self._volume_centres: dict[str, str] = {}
        self.retries = 0

    async def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> httpx.Response:
        first = min(self.settings.backoff_s, _MAX_RETRY_AFTER_S)
        backoff = Backoff(first, _MAX_RETRY_AFTER_S, jitter=0.2)
        for attempt in range(self.settings.max_retries + 1):
            try:
                return await self._once(method, path, body)
            except _Retryable as exc:
                if attempt == self.settings.max_retries:
                    raise ProviderError(
                        f"RunPod {method} {path} failed after {attempt + 1} attempts: {exc}"
                    ) from None
                wait = backoff.next_delay()
                if exc.retry_after is not None:  # the server's word, capped, with our jitter
                    wait = backoff.jittered(min(exc.retry_after, _MAX_RETRY_AFTER_S))
                log.warning("RunPod %s %s: %s; retry in %.2f s", method, path, exc, wait)
                self.retries += 1
                await asyncio.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _once(self, method: str, path: str, body: dict[str, Any] | None) -> httpx.Response:
        try:
            resp = await self._client.request(method, path, json=body)
        except httpx.TransportError as exc:
            raise _Retryable(f"{type(exc).__name__}") from None
        if resp.status_code in _RETRY_STATUS and not _is_no_capacity(resp):
            after = resp.headers.get("Retry-After")
            raise _Retryable(
                f"HTTP {resp.status_code}: {_message(resp)}",
                _float(after) if after is not None else None,
            )
        return resp

    async def _volume_centre(self, spec: PodSpec) -> str | None:
        """The data centre of the tier's network volume: its setting, else RunPod's word
        (``GET /networkvolumes/{id}``, asked once per volume)."""
        volume = self.settings.volume_for(spec.tier)
        if volume is None or not volume.runpod_id:
            return None
        if volume.data_center:
            return volume.data_center
        if volume.runpod_id not in self._volume_centres:
            resp = await self._request("GET", f"/networkvolumes/{volume.runpod_id}")
            self._check(resp, f"find network volume {volume.runpod_id}")
            body = resp.json()
            centre = body.get("dataCenterId") if isinstance(body, dict) else None
            if not isinstance(centre, str) or not centre:
                raise ProviderError(f"RunPod did not say where network volume "
                                    f"{volume.runpod_id} is (no dataCenterId)")  # fmt: skip
            self._volume_centres[volume.runpod_id] = centre
        centre = self._volume_centres[volume.runpod_id]
        if spec.data_centers and centre not in spec.data_centers:
            raise ProviderError(
                f"tier {spec.tier}: network volume {volume.runpod_id} is in {centre}, not in "
                f"its data_centers {list(spec.data_centers)}; a pod mounts a network volume "
                "only in the volume's data centre"
            )
        return centre

    def _options(self, spec: PodSpec, centre: str | None) -> Iterator[tuple[str, str, str | None]]:
        centres: tuple[str | None, ...] = (centre,) if centre else spec.data_centers or (None,)
        for gpu in spec.gpu_types:
            for cloud in spec.cloud_types:
                for dc in centres:
                    yield gpu, cloud, dc

    def _volume(self, spec: PodSpec) -> tuple[str | None, str, dict[str, str]]:
        """(network volume id, mount path, the worker env it brings): the tier's volume,
        else the pod's or the provider's ``network_volume_id``."""
        tier = self.settings.volume_for(spec.tier)
        if tier is not None and tier.runpod_id:
            return tier.runpod_id, tier.mount_path, tier.worker_env(tier.mount_path)
        volume = spec.network_volume_id or self.settings.network_volume_id
        mount = self.settings.volume_mount_path
        return volume, mount, {VOLUME_ENV: mount} if volume else {}

    def _body(self, spec: PodSpec, gpu: str, cloud: str, dc: str | None) -> dict[str, Any]:
        volume, mount, volume_env = self._volume(spec)
        env = {**volume_env, **spec.env,
               **{k: v.get_secret_value() for k, v in spec.secret_env.items()}}  # fmt: skip
        body: dict[str, Any] = {
            "name": spec.name,
            "gpuTypeIds": [gpu],
            "gpuCount": spec.gpu_count,
            "cloudType": cloud,
            "interruptible": spec.spot,
            "ports": [f"{port}/tcp" for port in spec.ports],
            "env": env,
        }
        if spec.template_id:  # the template supplies the image and its disk
            body["templateId"] = spec.template_id
        else:
            body["imageName"] = spec.image or self.settings.image
            body["containerDiskInGb"] = spec.container_disk_gb or self.settings.container_disk_gb
        if spec.gpu_count > 1:  # one worker per GPU, on ports port .. port + N - 1
            body["dockerStartCmd"] = spec.worker_args
        if volume:  # RunPod mounts it in place of the volume disk
            body["networkVolumeId"] = volume
            body["volumeMountPath"] = mount
        if dc is not None:
            body["dataCenterIds"] = [dc]
        return body

    async def create(self, spec: PodSpec) -> PodInfo:
        tried: list[str] = []
        centre = await self._volume_centre(spec)  # with a network volume: its data centre
        for gpu, cloud, dc in self._options(spec, centre):
            resp = await self._request("POST", "/pods", self._body(spec, gpu, cloud, dc))
            where = f"{gpu}/{cloud}" + (f"/{dc}" if dc else "")
            if resp.status_code in (200, 201):
                info = self._pod(resp.json(), spec.ports)
                log.info(
                    "created pod %s (%s) on %s at $%.3f/h",
                    spec.name,
                    info.id,
                    where,
                    info.cost_per_hr,
                )
                return info
            if _is_no_capacity(resp):
                tried.append(where)
                log.info("no capacity for %s on %s; trying the next option", spec.name, where)
                continue
            raise ProviderError(
                f"RunPod refused to create {spec.name} on {where}: HTTP {resp.status_code}: "
                f"{_message(resp)}"
            )
        raise NoCapacityError(
            f"no capacity for {spec.name} anywhere allowed (tried {', '.join(tried)})"
        )

    async def get(self, pod_id: str) -> PodInfo | None:
        resp = await self._request("GET", f"/pods/{pod_id}")
        if resp.status_code == 404:
            return None
        self._check(resp, f"get pod {pod_id}")
        return self._pod(resp.json(), None)

    async def list(self) -> list[PodInfo]:
        resp = await self._request("GET", "/pods")
        self._check(resp, "list pods")
        body = resp.json()
        items = body if isinstance(body, list) else body.get("pods", [])
        return [self._pod(p, None) for p in items if isinstance(p, dict)]

    async def stop(self, pod_id: str) -> None:
        resp = await self._request("POST", f"/pods/{pod_id}/stop")
        if resp.status_code != 404:
            self._check(resp, f"stop pod {pod_id}")

    async def start(self, pod_id: str) -> None:
        resp = await self._request("POST", f"/pods/{pod_id}/start")
        self._check(resp, f"start pod {pod_id}")

    async def terminate(self, pod_id: str) -> None:
        resp = await self._request("DELETE", f"/pods/{pod_id}")
        if resp.status_code != 404:
            self._check(resp, f"terminate pod {pod_id}")

    async def prices(self) -> dict[str, GpuPrice]:
        """GPU prices seen in pod responses (RunPod's ``gpu`` object)."""
        return dict(self._prices)

    async def aclose(self) -> None:
        await self._client.aclose()

    def _check(self, resp: httpx.Response, what: str) -> None:
        if resp.status_code >= 400:
            raise ProviderError(
                f"RunPod could not {what}: HTTP {resp.status_code}: {_message(resp)}"
            )

    def _pod(self, raw: dict[str, Any], ports: Sequence[int] | None) -> PodInfo:
        gpu = raw.get("gpu") if isinstance(raw.get("gpu"), dict) else None
        machine = raw.get("machine") if isinstance(raw.get("machine"), dict) else {}
        gpu_type = str((gpu or {}).get("id") or (machine or {}).get("gpuTypeId") or "")
        if gpu is not None and gpu_type:
            self._prices[gpu_type] = GpuPrice(
                gpu_type,
                _float(gpu.get("securePrice")),
                _float(gpu.get("communityPrice")),
                _float(gpu.get("secureSpotPrice")),
                _float(gpu.get("communitySpotPrice")),
            )
        cost = _float(raw.get("adjustedCostPerHr")) or _float(raw.get("costPerHr"))
        info = PodInfo(
            id=str(raw.get("id", "")),
            name=str(raw.get("name") or ""),
            status=_status(raw),
            cost_per_hr=cost,
            gpu_type=gpu_type,
            spot=bool(raw.get("interruptible", False)),
            cloud_type=str(raw.get("cloudType") or ""),
        )
        self._endpoints(info, raw, ports or _ports_of(raw))
        return info

    def _endpoints(self, info: PodInfo, raw: dict[str, Any], ports: Sequence[int]) -> None:
        """One endpoint per worker port, once every one of them has a public mapping."""
        ip = raw.get("publicIp")
        mappings = raw.get("portMappings") or {}
        if not ip or not ports or not isinstance(mappings, dict):
            return
        public = [int(mappings[str(port)]) for port in ports if mappings.get(str(port))]
        if len(public) < len(ports):
            return
        tls = self.settings.tls
        info.set_endpoints(tuple(
            Endpoint(f"{'wss' if tls else 'ws'}://{ip}:{p}/v1/tunnel",
                     f"{'https' if tls else 'http'}://{ip}:{p}")
            for p in public
        ))  # fmt: skip
        info.tls_server_name = tls_server_name(info.name) if tls and info.name else None


def _status(raw: dict[str, Any]) -> PodStatus:
    desired = str(raw.get("desiredStatus") or "")
    if desired == "RUNNING":
        return (
            PodStatus.RUNNING
            if raw.get("publicIp") and raw.get("portMappings")
            else PodStatus.PROVISIONING
        )
    if desired in ("EXITED", "STOPPED"):
        return PodStatus.EXITED
    if desired == "TERMINATED":
        return PodStatus.TERMINATED
    return PodStatus.PROVISIONING


def _ports_of(raw: dict[str, Any]) -> list[int]:
    """The pod's TCP ports in order: one per worker (GPU)."""
    out = []
    for p in raw.get("ports") or []:
        port, _, proto = str(p).partition("/")
        if proto == "tcp" and port.isdigit():
            out.append(int(port))
    return out


def _is_no_capacity(resp: httpx.Response) -> bool:
    if resp.status_code < 400:
        return False
    text = _message(resp).lower()
    return any(marker in text for marker in _NO_CAPACITY)
