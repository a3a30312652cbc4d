"""The ``kubernetes`` provider: one Deployment (1 replica) + Service per pod.

Manifests are rendered here (``render_worker``) and applied with ``kubectl``
(``apply -f -``, ``get -o json``, ``delete``); the GPUs come from
``nvidia.com/gpu`` resources (a pod of ``gpu_count`` > 1 runs ``worker --gpus N``,
one worker per GPU on ports 8443 + k, each a port of its Service), readiness
from ``/readyz``, liveness from ``/healthz``; each pod runs as uid 65534 on a
read-only root, as the restricted Pod Security Standard of deploy/k8s's
namespace asks. A pod's certificate and key go in a ``kubernetes.io/tls``
Secret of its own (same name as the pod), mounted at ``/etc/framerelay/tls``;
other secret env comes from the Secret ``secret_name``. A tier's ``volume.claim`` (a
PersistentVolumeClaim, ReadWriteMany for several pods) is mounted at its
``mount_path`` and holds the models and the workers' artefact cache
(``FRAMERELAY_WORKER_DETECTOR__CACHE_DIR``), TensorRT engines included. Manifests go to
kubectl on stdin, never on its command line. The rendering is validated in
tests; applying needs a cluster and kubectl.
"""

from __future__ import annotations

import base64
from typing import Any

from deploy.models import PodSpec
from deploy.settings import KubernetesSettings

MANAGED = {"app.kubernetes.io/managed-by": "framerelay-orchestrator"}
PORT = 8443
TLS_MOUNT = "/etc/framerelay/tls"
TLS_PEMS = {"FRAMERELAY_WORKER_TLS_CERT_PEM": "tls.crt", "FRAMERELAY_WORKER_TLS_KEY_PEM": "tls.key"}
NOBODY = 65534
PART_OF = {"app.kubernetes.io/part-of": "framerelay"}
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": NOBODY, "runAsGroup": NOBODY,
                "fsGroup": NOBODY, "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                      "capabilities": {"drop": ["ALL"]}}  # fmt: skip
WORKER_REQUESTS = {"cpu": "2", "memory": "4Gi"}
WORKER_LIMITS = {"cpu": "4", "memory": "8Gi"}
"""As the static GPU pool of deploy/k8s/overlays/prod (tests/deploy/test_kustomize.py)."""
SCRATCH = (("trt-cache", "/var/cache/framerelay/trt", "8Gi"), ("tmp", "/tmp", "256Mi"))  # noqa: S108
"""The worker's writable paths on its read-only root: (volume, mount path, size limit)."""
VOLUME = "models"
"""The tier's PersistentVolumeClaim (models and the artefact cache), when it names one."""


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
    volume = settings.volume_for(spec.tier)
    plain = {**(volume.worker_env(volume.mount_path) if volume else {}), **spec.env}
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(plain.items())]
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


def _container(spec: PodSpec, settings: KubernetesSettings, tls: bool) -> dict[str, Any]:
    """The worker container: non-root, read-only root, writable /tmp and engine cache."""
    get = {"port": PORT, "scheme": "HTTPS" if tls else "HTTP"}
    probe = {"httpGet": {"path": "/readyz", **get}, "periodSeconds": 5}
    mounts: list[dict[str, Any]] = [{"name": n, "mountPath": path} for n, path, _ in SCRATCH]
    if tls:
        mounts.insert(0, {"name": "tls", "mountPath": TLS_MOUNT, "readOnly": True})
    volume = settings.volume_for(spec.tier)
    if volume is not None and volume.claim:
        mounts.append({"name": VOLUME, "mountPath": volume.mount_path})
    return {
        "name": "worker",
        "image": spec.image or settings.image,
        "args": [*spec.worker_args, "--host", "0.0.0.0", "--port", str(PORT)],  # noqa: S104
        "ports": [
            {"name": _port_name(k), "containerPort": PORT + k, "protocol": "TCP"}
            for k in range(spec.gpu_count)
        ],
        "env": _env(spec, settings),
        "securityContext": CONTAINER_SECURITY,
        "resources": {
            "requests": dict(WORKER_REQUESTS),
            "limits": {**WORKER_LIMITS, "nvidia.com/gpu": spec.gpu_count},
        },
        "readinessProbe": probe,
        "startupProbe": {**probe, "failureThreshold": 120},
        "livenessProbe": {"httpGet": {"path": "/healthz", **get}, "periodSeconds": 10},
        "volumeMounts": mounts,
    }


def _port_name(k: int) -> str:
    """The first worker's port is ``tunnel``; worker k of a multi-GPU pod: ``tunnel-k``."""
    return "tunnel" if k == 0 else f"tunnel-{k}"


def _pod_spec(spec: PodSpec, settings: KubernetesSettings, tls: bool) -> dict[str, Any]:
    """The pod: the restricted Pod Security Standard (deploy/k8s labels its namespace so)."""
    volumes: list[dict[str, Any]] = [
        {"name": n, "emptyDir": {"sizeLimit": size}} for n, _, size in SCRATCH
    ]
    if tls:
        volumes.insert(0, {"name": "tls", "secret": {"secretName": spec.name,
                                                     "defaultMode": 0o440}})  # fmt: skip
    volume = settings.volume_for(spec.tier)
    if volume is not None and volume.claim:
        volumes.append({"name": VOLUME, "persistentVolumeClaim": {"claimName": volume.claim}})
    pod_spec: dict[str, Any] = {
        "containers": [_container(spec, settings, tls)],
        "automountServiceAccountToken": False,
        "securityContext": POD_SECURITY,
        "volumes": volumes,
    }
    if settings.node_selector:
        pod_spec["nodeSelector"] = dict(settings.node_selector)
    if spec.spot:
        pod_spec["tolerations"] = [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}]
    return pod_spec


def render_worker(spec: PodSpec, settings: KubernetesSettings) -> list[dict[str, Any]]:
    """A Deployment and a Service for one worker pod (no secret values in either)."""
    labels = {**MANAGED, **PART_OF, "app.kubernetes.io/name": "framerelay-worker",
              "framerelay/pod": spec.name}  # fmt: skip
    tls = all(k in spec.secret_env for k in TLS_PEMS)
    meta = {"name": spec.name, "namespace": settings.namespace, "labels": labels}
    pod_spec = _pod_spec(spec, settings, tls)
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
            "type": "ClusterIP",
            "selector": {"framerelay/pod": spec.name},
            "ports": [
                {"name": _port_name(k), "port": PORT + k, "targetPort": PORT + k, "protocol": "TCP"}
                for k in range(spec.gpu_count)
            ],
        },
    }
    return [deployment, service]
