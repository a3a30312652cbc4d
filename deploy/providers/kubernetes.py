"""The ``kubernetes`` provider: one Deployment (1 replica) + Service per pod.

Manifests are rendered here (``render_worker``) and applied with ``kubectl``
(``apply -f -``, ``get -o json``, ``delete``); the GPU comes from
``nvidia.com/gpu`` resources, readiness from ``/readyz``, liveness from
``/healthz``. Secrets come from a Kubernetes Secret, never from the manifest.
The rendering is validated in tests; applying needs a cluster and kubectl.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from typing import Any

from deploy.models import PodInfo, PodSpec, PodStatus
from deploy.providers.base import GpuPrice, ProviderError
from deploy.settings import KubernetesSettings
from framerelay.errors import ConfigError

MANAGED = {"app.kubernetes.io/managed-by": "framerelay-orchestrator"}
PORT = 8443


def render_worker(spec: PodSpec, settings: KubernetesSettings) -> list[dict[str, Any]]:
    """A Deployment and a Service for one worker pod."""
    labels = {**MANAGED, "app.kubernetes.io/name": "framerelay-worker", "framerelay/pod": spec.name}
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(spec.env.items())]
    env += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": settings.secret_name, "key": k}}}
        for k in sorted(spec.secret_env)
    ]
    probe = {"httpGet": {"path": "/readyz", "port": PORT}, "periodSeconds": 5}
    container = {
        "name": "worker",
        "image": spec.image or settings.image,
        "args": ["worker", "--host", "0.0.0.0", "--port", str(PORT)],  # noqa: S104 - in a pod
        "ports": [{"name": "tunnel", "containerPort": PORT, "protocol": "TCP"}],
        "env": env,
        "resources": {"limits": {"nvidia.com/gpu": spec.gpu_count}},
        "readinessProbe": probe,
        "startupProbe": {**probe, "failureThreshold": 120},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": PORT}, "periodSeconds": 10},
    }
    meta = {"name": spec.name, "namespace": settings.namespace, "labels": labels}
    pod_spec: dict[str, Any] = {"containers": [container]}
    if settings.node_selector:
        pod_spec["nodeSelector"] = dict(settings.node_selector)
    if spec.spot:
        pod_spec["tolerations"] = [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}]
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"framerelay/pod": spec.name}},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "selector": {"framerelay/pod": spec.name},
            "ports": [{"name": "tunnel", "port": PORT, "targetPort": PORT, "protocol": "TCP"}],
        },
    }
    return [deployment, service]


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
            raise ProviderError(f"kubectl {args[0]} failed: {err.decode(errors='replace')[:300]}")
        return out.decode()

    def _info(self, dep: dict[str, Any]) -> PodInfo:
        name = str(dep["metadata"]["name"])
        ready = int(dep.get("status", {}).get("readyReplicas") or 0)
        host = f"{name}.{self.settings.namespace}.svc"
        info = PodInfo(id=name, name=name, status=PodStatus.PROVISIONING, gpu_type="kubernetes")
        if ready:
            info.status = PodStatus.RUNNING
            info.tunnel_url, info.http_url = (
                f"ws://{host}:{PORT}/v1/tunnel",
                f"http://{host}:{PORT}",
            )
        return info

    async def create(self, spec: PodSpec) -> PodInfo:
        docs = {"apiVersion": "v1", "kind": "List", "items": render_worker(spec, self.settings)}
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
        await self._kubectl("delete", "deployment,service", pod_id, "--ignore-not-found")

    async def prices(self) -> dict[str, GpuPrice]:
        return {}

    async def aclose(self) -> None:
        return None
