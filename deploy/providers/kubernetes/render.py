"""The Kubernetes objects of one worker pod, as the orchestrator applies them.

The orchestrator is the controller of its worker pods: each is a bare ``Pod`` (a
Deployment would recreate a pod the fleet has decided is lost), beside its
``kubernetes.io/tls`` Secret (the pod's certificate and key, in ``data`` only), its
NetworkPolicy (the ingest and the orchestrator, and a Prometheus labelled
``framerelay.io/metrics-scraper``, reach every worker's port: worker k of an N-GPU pod
serves its tunnel, ``/readyz`` and ``/metrics`` on 8443 + k) and its ClusterIP Service
(one port per worker). :func:`render_pod_objects` gives them in the order they are
applied (server-side, by :mod:`deploy.providers.kubernetes.provider`);
:func:`render_disruption_budget` gives a tier's PodDisruptionBudget.

The pod runs ``framerelay worker`` (``--gpus N`` for N GPUs) as uid 65534 on a read-only
root with every capability dropped: the restricted Pod Security Standard that
deploy/k8s's namespace enforces. Where it runs, its GPU resource and its CPU and memory
(per GPU) come from its tier's scheduling profile
(:mod:`deploy.providers.kubernetes.profiles`). Other secret env comes from the Secret
``secret_name`` by reference. A tier's ``volume.claim`` (a PersistentVolumeClaim,
ReadWriteMany for several pods) is mounted at its ``mount_path`` and holds the models and
the workers' artefact cache (``FRAMERELAY_WORKER_DETECTOR__CACHE_DIR``).
"""

from __future__ import annotations

import base64
from typing import Any

from deploy.models import PodSpec
from deploy.providers.kubernetes.profiles import SchedulingProfile, Share, profile_for
from deploy.settings import KubernetesSettings

MANAGED = {"app.kubernetes.io/managed-by": "framerelay-orchestrator"}
"""On every object the orchestrator makes: it lists and watches its pods by it."""
POD_LABEL = "framerelay/pod"
TIER_LABEL = "framerelay/tier"
PART_OF = {"app.kubernetes.io/part-of": "framerelay"}
WORKER_APP = {"app.kubernetes.io/name": "framerelay-worker"}
"""The label deploy/k8s's NetworkPolicies know workers by (no egress, metrics)."""
PEERS = ("framerelay-ingest", "framerelay-orchestrator")
"""The ``app.kubernetes.io/name`` of the pods that call a worker (deploy/k8s)."""
SCRAPER = {"framerelay.io/metrics-scraper": "true"}
"""A Prometheus in any namespace carrying this label may scrape ``/metrics``."""
PORT = 8443
WORKER = "worker"
TLS_MOUNT = "/etc/framerelay/tls"
TLS_PEMS = {"FRAMERELAY_WORKER_TLS_CERT_PEM": "tls.crt", "FRAMERELAY_WORKER_TLS_KEY_PEM": "tls.key"}
NOBODY = 65534
POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": NOBODY,
    "runAsGroup": NOBODY,
    "fsGroup": NOBODY,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
SCRATCH = (("trt-cache", "/var/cache/framerelay/trt", "8Gi"), ("tmp", "/tmp", "256Mi"))  # noqa: S108
"""The worker's writable paths on its read-only root: (volume, mount path, size limit)."""
VOLUME = "models"
"""The tier's PersistentVolumeClaim (models and the artefact cache), when it names one."""


def labels(name: str, tier: str) -> dict[str, str]:
    """The labels of every object of one pod (the Pod has its profile's too)."""
    return {**MANAGED, **PART_OF, **WORKER_APP, POD_LABEL: name, TIER_LABEL: tier}


def _meta(spec: PodSpec, settings: KubernetesSettings) -> dict[str, Any]:
    return {
        "name": spec.name,
        "namespace": settings.namespace,
        "labels": labels(spec.name, spec.tier),
    }


def _has_tls(spec: PodSpec) -> bool:
    return all(k in spec.secret_env for k in TLS_PEMS)


def render_tls_secret(spec: PodSpec, settings: KubernetesSettings) -> dict[str, Any] | None:
    """The pod's ``kubernetes.io/tls`` Secret (None when it has no certificate): the PEMs
    in ``data`` and nowhere else."""
    if not _has_tls(spec):
        return None
    data = {
        name: base64.b64encode(spec.secret_env[k].get_secret_value().encode()).decode()
        for k, name in TLS_PEMS.items()
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(spec, settings),
        "type": "kubernetes.io/tls",
        "data": data,
    }


def _env(spec: PodSpec, settings: KubernetesSettings) -> list[dict[str, Any]]:
    volume = settings.volume_for(spec.tier)
    plain = {**(volume.worker_env(volume.mount_path) if volume else {}), **spec.env}
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(plain.items())]
    env += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": settings.secret_name, "key": k}}}
        for k in sorted(spec.secret_env)
        if k not in TLS_PEMS
    ]
    if _has_tls(spec):
        env += [
            {"name": "FRAMERELAY_WORKER_TLS_CERT", "value": f"{TLS_MOUNT}/tls.crt"},
            {"name": "FRAMERELAY_WORKER_TLS_KEY", "value": f"{TLS_MOUNT}/tls.key"},
        ]
    return env


def _cpu(cores: float) -> str:
    """A CPU quantity: whole cores as ``"2"``, else millicores (``"1500m"``)."""
    return str(int(cores)) if float(cores).is_integer() else f"{round(cores * 1000)}m"


def _memory(gib: float) -> str:
    """A memory quantity: whole GiB as ``"4Gi"``, else MiB (``"1536Mi"``)."""
    return f"{int(gib)}Gi" if float(gib).is_integer() else f"{round(gib * 1024)}Mi"


def _scaled(share: Share, gpus: int) -> dict[str, str]:
    return {"cpu": _cpu(share.cpu * gpus), "memory": _memory(share.memory_gib * gpus)}


def _resources(spec: PodSpec, profile: SchedulingProfile) -> dict[str, Any]:
    """CPU and memory per GPU times the pod's GPUs; the GPUs as a limit (an extended
    resource's request is its limit)."""
    return {
        "requests": _scaled(profile.requests_per_gpu, spec.gpu_count),
        "limits": {
            **_scaled(profile.limits_per_gpu, spec.gpu_count),
            profile.gpu_resource: spec.gpu_count,
        },
    }


def _port_name(k: int) -> str:
    """The first worker's port is ``tunnel``; worker k of a multi-GPU pod: ``tunnel-k``."""
    return "tunnel" if k == 0 else f"tunnel-{k}"


def _container(
    spec: PodSpec, settings: KubernetesSettings, profile: SchedulingProfile
) -> dict[str, Any]:
    """The worker container: non-root, read-only root, writable /tmp and engine cache."""
    tls = _has_tls(spec)
    get = {"port": PORT, "scheme": "HTTPS" if tls else "HTTP"}
    probe = {"httpGet": {"path": "/readyz", **get}, "periodSeconds": 5}
    mounts: list[dict[str, Any]] = [{"name": n, "mountPath": path} for n, path, _ in SCRATCH]
    if tls:
        mounts.insert(0, {"name": "tls", "mountPath": TLS_MOUNT, "readOnly": True})
    volume = settings.volume_for(spec.tier)
    if volume is not None and volume.claim:
        mounts.append({"name": VOLUME, "mountPath": volume.mount_path})
    return {
        "name": WORKER,
        "image": spec.image or settings.image,
        "args": [*spec.worker_args, "--host", "0.0.0.0", "--port", str(PORT)],  # noqa: S104
        "ports": [
            {"name": _port_name(k), "containerPort": PORT + k, "protocol": "TCP"}
            for k in range(spec.gpu_count)
        ],
        "env": _env(spec, settings),
        "securityContext": CONTAINER_SECURITY,
        "resources": _resources(spec, profile),
        "readinessProbe": probe,
        "startupProbe": {**probe, "failureThreshold": 120},
        "livenessProbe": {"httpGet": {"path": "/healthz", **get}, "periodSeconds": 10},
        "volumeMounts": mounts,
    }


def _volumes(spec: PodSpec, settings: KubernetesSettings) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": n, "emptyDir": {"sizeLimit": size}} for n, _, size in SCRATCH
    ]
    if _has_tls(spec):
        secret = {"secretName": spec.name, "defaultMode": 0o440}
        volumes.insert(0, {"name": "tls", "secret": secret})
    volume = settings.volume_for(spec.tier)
    if volume is not None and volume.claim:
        volumes.append({"name": VOLUME, "persistentVolumeClaim": {"claimName": volume.claim}})
    return volumes


def _placement(spec: PodSpec, profile: SchedulingProfile) -> dict[str, Any]:
    """Where the pod may run: the profile's selectors, tolerations, spread and runtime."""
    tier = {**MANAGED, TIER_LABEL: spec.tier}
    spread = [
        {
            "maxSkew": s.max_skew,
            "topologyKey": s.topology_key,
            "whenUnsatisfiable": s.when_unsatisfiable,
            "labelSelector": {"matchLabels": tier},
        }
        for s in profile.topology_spread
    ]
    out: dict[str, Any] = {
        "tolerations": [t.manifest() for t in profile.tolerations],
        "nodeSelector": dict(profile.node_selector),
        "affinity": profile.affinity,
        "runtimeClassName": profile.runtime_class_name,
        "imagePullSecrets": [{"name": n} for n in profile.image_pull_secrets],
        "topologySpreadConstraints": spread,
    }
    return {k: v for k, v in out.items() if v}


def render_pod(spec: PodSpec, settings: KubernetesSettings) -> dict[str, Any]:
    """The worker Pod: the restricted Pod Security Standard, its tier's profile."""
    profile = profile_for(settings, spec.tier)
    meta = _meta(spec, settings)
    meta["labels"] = {**profile.labels, **meta["labels"]}
    if profile.annotations:
        meta["annotations"] = dict(profile.annotations)
    pod_spec: dict[str, Any] = {
        "containers": [_container(spec, settings, profile)],
        "restartPolicy": "Always",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": POD_SECURITY,
        "volumes": _volumes(spec, settings),
        **_placement(spec, profile),
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def _ports(spec: PodSpec) -> list[dict[str, Any]]:
    return [{"port": PORT + k, "protocol": "TCP"} for k in range(spec.gpu_count)]


def render_network_policy(spec: PodSpec, settings: KubernetesSettings) -> dict[str, Any]:
    """Who reaches the pod: its workers' ports (tunnel, ``/metrics``) from the ingest and
    the orchestrator (and ``peer_cidrs``), and from a metrics scraper; it calls no one."""
    peers: list[dict[str, Any]] = [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": app}}} for app in PEERS
    ]
    peers += [{"ipBlock": {"cidr": str(cidr)}} for cidr in settings.peer_cidrs]
    scraper = {"namespaceSelector": {}, "podSelector": {"matchLabels": SCRAPER}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(spec, settings),
        "spec": {
            "podSelector": {"matchLabels": {POD_LABEL: spec.name}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {"from": peers, "ports": _ports(spec)},
                {"from": [scraper], "ports": _ports(spec)},
            ],
            "egress": [],
        },
    }


def render_service(spec: PodSpec, settings: KubernetesSettings) -> dict[str, Any]:
    """The pod's ClusterIP Service: ``<pod>.<namespace>.svc``, one port per worker."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(spec, settings),
        "spec": {
            "type": "ClusterIP",
            "selector": {POD_LABEL: spec.name},
            "ports": [
                {"name": _port_name(k), "port": PORT + k, "targetPort": PORT + k, "protocol": "TCP"}
                for k in range(spec.gpu_count)
            ],
        },
    }


def render_pod_objects(spec: PodSpec, settings: KubernetesSettings) -> list[dict[str, Any]]:
    """Everything one worker pod needs, in apply order: its TLS Secret (when it has a
    certificate), NetworkPolicy, Service, then the Pod that mounts the Secret."""
    secret = render_tls_secret(spec, settings)
    return [
        *([secret] if secret is not None else []),
        render_network_policy(spec, settings),
        render_service(spec, settings),
        render_pod(spec, settings),
    ]


def disruption_budget_name(tier: str) -> str:
    return f"framerelay-{tier}"


def render_disruption_budget(
    tier: str, min_available: int, settings: KubernetesSettings
) -> dict[str, Any]:
    """A tier's PodDisruptionBudget: a node drain leaves ``min_available`` of its pods
    (an integer: the only form bare pods allow). A pod that is not ready may always be
    evicted (``unhealthyPodEvictionPolicy: AlwaysAllow``): a broken worker never blocks a
    drain."""
    if min_available < 0:
        raise ValueError(f"min_available must be 0 or more, got {min_available}")
    selector = {**MANAGED, TIER_LABEL: tier}
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": disruption_budget_name(tier),
            "namespace": settings.namespace,
            "labels": {**MANAGED, **PART_OF, TIER_LABEL: tier},
        },
        "spec": {
            "minAvailable": min_available,
            "selector": {"matchLabels": selector},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def worker_ports(pod: dict[str, Any]) -> list[int]:
    """The ports of a rendered (or read back) Pod's workers, in worker order: one per
    GPU, from the worker container's ``tunnel`` ports (empty: no such container)."""
    containers = pod.get("spec", {}).get("containers") or []
    worker = next((c for c in containers if c.get("name") == WORKER), None)
    if worker is None:
        return []
    ports = [
        int(p["containerPort"])
        for p in worker.get("ports") or []
        if str(p.get("name", "")).startswith("tunnel") and "containerPort" in p
    ]
    return sorted(ports)
