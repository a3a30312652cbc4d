"""The ``kubernetes`` provider: one Deployment (1 replica) + Service per pod.

Manifests are rendered here (``render_worker``) and applied with ``kubectl``
(``apply -f -``, ``get -o json``, ``delete``); the GPU comes from
``nvidia.com/gpu`` resources, readiness from ``/readyz``, liveness from
``/healthz``. A pod's certificate and key go in a ``kubernetes.io/tls``
Secret of its own (same name as the pod), mounted at ``/etc/framerelay/tls``;
other secret env comes from the Secret ``secret_name``. Manifests go to
kubectl on stdin, never on its command line. The rendering is validated in
tests; applying needs a cluster and kubectl.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
from typing import Any

from deploy.models import PodInfo, PodSpec, PodStatus, tls_server_name
from deploy.providers.base import GpuPrice, ProviderError
from deploy.settings import KubernetesSettings
from framerelay.errors import ConfigError

MANAGED = {"app.kubernetes.io/managed-by": "framerelay-orchestrator"}
PORT = 8443
TLS_MOUNT = "/etc/framerelay/tls"
TLS_PEMS = {"FRAMERELAY_WORKER_TLS_CERT_PEM": "tls.crt", "FRAMERELAY_WORKER_TLS_KEY_PEM": "tls.key"}
NOBODY = 65534
_LONG_B64 = re.compile(r"[A-Za-z0-9+/=_-]{40,}")


def render_tls_secret(spec: PodSpec, settings: KubernetesSettings) -> dict[str, Any] | None:
    """The pod's ``kubernetes.io/tls`` Secret (None when it has no certificate)."""
    if not all(k in spec.secret_env for k in TLS_PEMS):
        return None
    data = {
        name: base64.b64encode(spec.secret_env[k].get_secret_value().encode()).decode()
        for k, name in TLS_PEMS.items()
    }
    meta = {"name": spec.name, "namespace": settings.namespace,
            "labels": {**MANAGED, "framerelay/pod": spec.name}}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls", "metadata": meta,
            "data": data}  # fmt: skip


def _env(spec: PodSpec, settings: KubernetesSettings) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(spec.env.items())]
    env += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": settings.secret_name, "key": k}}}
        for k in sorted(spec.secret_env)
        if k not in TLS_PEMS
    ]
    if all(k in spec.secret_env for k in TLS_PEMS):
        env += [
            {"name": "FRAMERELAY_WORKER_TLS_CERT", "value": f"{TLS_MOUNT}/tls.crt"},
            {"name": "FRAMERELAY_WORKER_TLS_KEY", "value": f"{TLS_MOUNT}/tls.key"},
        ]
    return env


def render_worker(spec: PodSpec, settings: KubernetesSettings) -> list[dict[str, Any]]:
    """A Deployment and a Service for one worker pod (no secret values in either)."""
    labels = {**MANAGED, "app.kubernetes.io/name": "framerelay-worker", "framerelay/pod": spec.name}
    env = _env(spec, settings)
    tls = all(k in spec.secret_env for k in TLS_PEMS)
    get = {"port": PORT, "scheme": "HTTPS" if tls else "HTTP"}
    probe = {"httpGet": {"path": "/readyz", **get}, "periodSeconds": 5}
    container = {
        "name": "worker",
        "image": spec.image or settings.image,
        "args": ["worker", "--host", "0.0.0.0", "--port", str(PORT)],  # noqa: S104 - in a pod
        "ports": [{"name": "tunnel", "containerPort": PORT, "protocol": "TCP"}],
        "env": env,
        "resources": {"limits": {"nvidia.com/gpu": spec.gpu_count}},
        "readinessProbe": probe,
        "startupProbe": {**probe, "failureThreshold": 120},
        "livenessProbe": {"httpGet": {"path": "/healthz", **get}, "periodSeconds": 10},
    }
    meta = {"name": spec.name, "namespace": settings.namespace, "labels": labels}
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": NOBODY, "fsGroup": NOBODY},
    }
    if tls:
        container["volumeMounts"] = [{"name": "tls", "mountPath": TLS_MOUNT, "readOnly": True}]
        pod_spec["volumes"] = [{"name": "tls", "secret": {"secretName": spec.name,
                                                          "defaultMode": 0o440}}]  # fmt: skip
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
            info.tunnel_url = f"{'wss' if tls else 'ws'}://{host}:{PORT}/v1/tunnel"
            info.http_url = f"{'https' if tls else 'http'}://{host}:{PORT}"
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
