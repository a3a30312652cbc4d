"""A pod as RunPod's API v2 says it (``Pod``), and the body that creates one
(``CreatePodRequest``).

**The create body** is nested: ``name``; ``gpu`` ``{id, count}`` with the host's CUDA
constraint (``minCudaVersion``, or ``allowedCudaVersions``: the CUDA worker image needs
12.8); ``cloud`` (``SECURE`` or ``COMMUNITY``); ``dataCenterIds`` when the choice names
data centres; ``ports`` (one ``<port>/tcp`` per GPU: ``8443/tcp``, ``8444/tcp``, ...);
``env`` (the worker's, with the pod's keys and certificate, and its volume's cache
directories); ``image`` and ``disk``, or a ``templateId`` that supplies them; ``args``
(``worker --gpus N``, the image's ``framerelay`` entrypoint's arguments) for a pod of
several GPUs; ``registry`` for a private image; ``mounts.network`` for a network volume.
RunPod refuses a field it does not know by name, and nothing else is sent (no spot or
interruptible field: v2 has none).

**A pod's view**: ``status`` PROVISIONING and STARTING are provisioning; RUNNING is
running once every worker port has a public mapping in ``runtime.ports`` (``private``
port, ``public`` port, ``ip``), else still provisioning (the provider fails it after
its grace: :mod:`deploy.providers.runpod.provider`); EXITED, ERROR and TERMINATED are
themselves. An address in a private or shared range (``10/8``, ``172.16/12``,
``192.168/16``, ``100.64/10``, link-local) is no public mapping: the orchestrator and
the ingest are in another cloud. The price the fleet accounts is the pod's ``cost``.
"""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import SecretStr

from deploy.models import Endpoint, PodInfo, PodSpec, PodStatus, tls_server_name
from deploy.providers.runpod.catalog import Candidate
from deploy.settings import RunPodSettings

_STATUS = {
    "PROVISIONING": PodStatus.PROVISIONING,
    "STARTING": PodStatus.PROVISIONING,
    "RUNNING": PodStatus.RUNNING,
    "EXITED": PodStatus.EXITED,
    "ERROR": PodStatus.ERROR,
    "TERMINATED": PodStatus.TERMINATED,
}
_NOT_PUBLIC = tuple(
    ipaddress.ip_network(net)
    for net in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "169.254.0.0/16",
        "fc00::/7",
        "fe80::/10",
    )
)


def _float(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


def create_body(
    spec: PodSpec,
    cand: Candidate,
    settings: RunPodSettings,
    volume: tuple[str | None, str, Mapping[str, str]],
) -> dict[str, Any]:
    """The ``POST /pods`` body of ``spec`` on ``cand``; ``volume``: (network volume id,
    its mount path, the worker env it brings)."""
    volume_id, mount, volume_env = volume
    env = {**volume_env, **spec.env, **_reveal(spec.secret_env)}
    body: dict[str, Any] = {
        "name": spec.name,
        "gpu": {"id": cand.gpu_type, "count": spec.gpu_count, **settings.cuda},
        "cloud": cand.cloud,
        "ports": [f"{port}/tcp" for port in spec.ports],
        "env": env,
    }
    if spec.template_id:  # the template supplies the image and its disk
        body["templateId"] = spec.template_id
    else:
        body["image"] = spec.image or settings.image
        body["disk"] = spec.container_disk_gb or settings.container_disk_gb
    if settings.registry:
        body["registry"] = settings.registry
    if spec.gpu_count > 1:  # one worker per GPU, on ports port .. port + N - 1
        body["args"] = shlex.join(spec.worker_args)
    if volume_id:
        body["mounts"] = {"network": [{"volumeId": volume_id, "path": mount}]}
    if cand.centres:
        body["dataCenterIds"] = list(cand.centres)
    return body


def _reveal(secret_env: Mapping[str, SecretStr]) -> dict[str, str]:
    """The pod's secret env, in the body only (RunPod hands it to the container)."""
    return {k: v.get_secret_value() for k, v in secret_env.items()}


def worker_ports(raw: Mapping[str, Any]) -> list[int]:
    """The pod's TCP ports in order: one per worker (GPU)."""
    out = []
    for entry in raw.get("ports") or []:
        port, _, proto = str(entry).partition("/")
        if proto == "tcp" and port.isdigit():
            out.append(int(port))
    return out


def _public_ip(value: object) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        addr = ipaddress.ip_address(value)
    except ValueError:
        return None
    return None if any(addr in net for net in _NOT_PUBLIC) else value


def public_mappings(raw: Mapping[str, Any], ports: Sequence[int]) -> dict[int, tuple[str, int]]:
    """Worker port -> (public IP, public port), for the ports that have one."""
    runtime = raw.get("runtime") if isinstance(raw.get("runtime"), dict) else {}
    out: dict[int, tuple[str, int]] = {}
    for entry in (runtime or {}).get("ports") or []:
        if not isinstance(entry, dict) or entry.get("type", "tcp") != "tcp":
            continue
        private, public, ip = entry.get("private"), entry.get("public"), _public_ip(entry.get("ip"))
        if isinstance(private, int) and private in ports and isinstance(public, int) and public > 0:
            if ip is not None:
                out[private] = (ip, public)
    return out


def uptime(raw: Mapping[str, Any]) -> float | None:
    """Seconds since the pod's container started, as RunPod says (None: not said)."""
    runtime = raw.get("runtime")
    value = runtime.get("uptime") if isinstance(runtime, dict) else None
    return float(value) if isinstance(value, int | float) and value >= 0 else None


def pod_info(raw: Mapping[str, Any], ports: Sequence[int], tls: bool) -> PodInfo:
    """What the provider reports of one pod; RUNNING only once every worker port has a
    public mapping (one endpoint per worker, in GPU order)."""
    gpu = raw.get("gpu") if isinstance(raw.get("gpu"), dict) else {}
    status = _STATUS.get(str(raw.get("status")), PodStatus.PROVISIONING)
    info = PodInfo(
        id=str(raw.get("id", "")),
        name=str(raw.get("name") or ""),
        status=status,
        cost_per_hr=_float(raw.get("cost")),
        gpu_type=str((gpu or {}).get("id") or ""),
        cloud_type=str(raw.get("cloud") or ""),
        data_center=str(raw.get("dataCenterId") or ""),
    )
    if status is PodStatus.ERROR:
        info.reason = (
            f"RunPod says ERROR (its container cannot recover) for {info.gpu_type or 'a GPU'} "
            f"in {info.data_center or 'an unknown data centre'}/{info.cloud_type or '?'}"
        )
    mapped = public_mappings(raw, ports)
    if not ports or len(mapped) < len(ports):
        if status is PodStatus.RUNNING:
            info.status = PodStatus.PROVISIONING  # no address yet
        return info
    scheme, web = ("wss", "https") if tls else ("ws", "http")
    info.set_endpoints(
        tuple(
            Endpoint(f"{scheme}://{ip}:{public}/v1/tunnel", f"{web}://{ip}:{public}")
            for ip, public in (mapped[port] for port in ports)
        )
    )
    info.tls_server_name = tls_server_name(info.name) if tls and info.name else None
    return info
