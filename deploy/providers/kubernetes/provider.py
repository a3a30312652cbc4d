"""The ``kubernetes`` provider: creates, lists and deletes the worker pods that
:mod:`deploy.providers.kubernetes.render` renders."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from typing import Any

from deploy.models import Endpoint, PodInfo, PodSpec, PodStatus, tls_server_name
from deploy.providers.base import GpuPrice, ProviderError
from deploy.providers.kubernetes.render import MANAGED, PORT, render_tls_secret, render_worker
from deploy.settings import KubernetesSettings
from framerelay.errors import ConfigError

_LONG_B64 = re.compile(r"[A-Za-z0-9+/=_-]{40,}")


def _gpu_count(dep: dict[str, Any]) -> int:
    """The GPUs a Deployment's worker container asks for (one worker each)."""
    try:
        container = dep["spec"]["template"]["spec"]["containers"][0]
        return max(1, int(container["resources"]["limits"]["nvidia.com/gpu"]))
    except (KeyError, IndexError, TypeError, ValueError):
        return 1


class KubernetesProvider:
    name = "kubernetes"

    def __init__(self, settings: KubernetesSettings) -> None:
        if shutil.which(settings.kubectl) is None:
            raise ConfigError(f"the kubernetes provider needs {settings.kubectl!r} on PATH")
        self.settings = settings

    async def _kubectl(self, *args: str, stdin: str | None = None) -> str:
        proc = await asyncio.create_subprocess_exec(
            self.settings.kubectl, "-n", self.settings.namespace, *args,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate(stdin.encode() if stdin else None)
        if proc.returncode != 0:
            text = _LONG_B64.sub("***", err.decode(errors="replace"))  # never echo Secret data
            raise ProviderError(f"kubectl {args[0]} failed: {text[:300]}")
        return out.decode()

    def cert_names(self, name: str) -> tuple[list[str], list[str]]:
        """Extra names in a pod's certificate: its Service's DNS name."""
        return [f"{name}.{self.settings.namespace}.svc"], []

    def _info(self, dep: dict[str, Any]) -> PodInfo:
        name = str(dep["metadata"]["name"])
        ready = int(dep.get("status", {}).get("readyReplicas") or 0)
        host = f"{name}.{self.settings.namespace}.svc"
        info = PodInfo(id=name, name=name, status=PodStatus.PROVISIONING, gpu_type="kubernetes")
        if ready:
            tls = self.settings.tls
            info.status = PodStatus.RUNNING
            info.set_endpoints(tuple(
                Endpoint(f"{'wss' if tls else 'ws'}://{host}:{PORT + k}/v1/tunnel",
                         f"{'https' if tls else 'http'}://{host}:{PORT + k}")
                for k in range(_gpu_count(dep))
            ))  # fmt: skip
            info.tls_server_name = tls_server_name(name) if tls else None
        return info

    async def create(self, spec: PodSpec) -> PodInfo:
        secret = render_tls_secret(spec, self.settings)
        items = [*([secret] if secret else []), *render_worker(spec, self.settings)]
        docs = {"apiVersion": "v1", "kind": "List", "items": items}
        await self._kubectl("apply", "-f", "-", stdin=json.dumps(docs))
        return PodInfo(id=spec.name, name=spec.name, status=PodStatus.PROVISIONING, spot=spec.spot)

    async def get(self, pod_id: str) -> PodInfo | None:
        return next((p for p in await self.list() if p.id == pod_id), None)

    async def list(self) -> list[PodInfo]:
        selector = ",".join(f"{k}={v}" for k, v in MANAGED.items())
        raw = json.loads(await self._kubectl("get", "deployments", "-l", selector, "-o", "json"))
        return [self._info(d) for d in raw.get("items", [])]

    async def stop(self, pod_id: str) -> None:
        await self._kubectl("scale", "deployment", pod_id, "--replicas=0")

    async def terminate(self, pod_id: str) -> None:
        await self._kubectl("delete", "deployment,service,secret", pod_id, "--ignore-not-found")

    async def prices(self) -> dict[str, GpuPrice]:
        return {}

    async def aclose(self) -> None:
        return None
