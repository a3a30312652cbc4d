"""The default scheduler's filters, as far as GPU pods meet them, and its words.

A pod fits a node when the node is schedulable, every ``NoSchedule``/``NoExecute``
taint is tolerated (Equal/Exists, an empty key with Exists tolerates all, an empty
effect matches every effect), ``nodeSelector`` and the required node affinity match
(In, NotIn, Exists, DoesNotExist, Gt, Lt; terms ORed, expressions ANDed) and the
pod's requests (limits standing in for missing requests) fit what the node's
allocatable leaves beside the pods bound to it. Filters run in the scheduler's order
and the first that fails is the node's reason. When no node fits, the pod's
``PodScheduled`` condition says why as the scheduler does (``FitError``)::

    0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) had untolerated
    taint {nvidia.com/gpu: present}. preemption: 0/3 nodes are available: 1 No
    preemption victims found for incoming pod, 2 Preemption is not helpful for scheduling.

Among the nodes that fit, the least allocated wins (the default scoring), then the
name."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tests.support.k8s_api.resources import Obj
from tests.support.k8s_api.selectors import requirement
from tests.support.k8s_api.store import now_iso

NOT_HELPFUL = "Preemption is not helpful for scheduling"
NO_VICTIMS = "No preemption victims found for incoming pod"
_SUFFIX = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([A-Za-z]*)$")


def quantity(value: Any) -> float:
    """A resource quantity (``500m``, ``4Gi``, ``2``) as a number."""
    found = _QUANTITY.match(str(value).strip())
    if not found or (found.group(2) and found.group(2) not in _SUFFIX):
        raise ValueError(f"not a quantity: {value!r}")
    return float(found.group(1)) * _SUFFIX.get(found.group(2), 1)


@dataclass(frozen=True)
class NodeSpec:
    """A node given to the server: its labels, taints and allocatable resources."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[dict[str, str], ...] = ()
    """``{"key": ..., "value": ..., "effect": "NoSchedule"}`` each (value optional)."""
    allocatable: dict[str, str] = field(
        default_factory=lambda: {"cpu": "16", "memory": "64Gi", "pods": "110"}
    )


def pod_requests(spec: Obj) -> dict[str, float]:
    """What a pod asks for: its containers' requests summed (a limit stands in for a
    missing request), at least each init container's."""

    def one(c: Obj) -> dict[str, float]:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {k: quantity(v) for k, v in merged.items()}

    total: dict[str, float] = {}
    for c in spec["containers"]:
        for k, v in one(c).items():
            total[k] = total.get(k, 0.0) + v
    for c in spec.get("initContainers", []):
        for k, v in one(c).items():
            total[k] = max(total.get(k, 0.0), v)
    return dict(total)


def tolerates(toleration: Obj, taint: Obj) -> bool:
    effect = toleration.get("effect")
    if effect and effect != taint.get("effect"):
        return False
    key, op = str(toleration.get("key", "")), str(toleration.get("operator", "Equal"))
    if not key:
        return op == "Exists"
    if key != taint["key"]:
        return False
    return op == "Exists" or str(toleration.get("value", "")) == str(taint.get("value", ""))


def untolerated_taint(taints: list[Obj], tolerations: list[Obj]) -> Obj | None:
    for taint in taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def affinity_matches(spec: Obj, node: Obj) -> bool:
    labels = node["metadata"].get("labels") or {}
    if not (spec.get("nodeSelector") or {}).items() <= labels.items():
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms")
    if not terms:
        return True
    fields = {"metadata.name": node["metadata"]["name"]}
    return any(_term_matches(term, labels, fields) for term in terms)


def _term_matches(term: Obj, labels: dict[str, str], fields: dict[str, str]) -> bool:
    exprs, by_field = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not exprs and not by_field:
        return False  # an empty term matches no node
    return all(requirement(e)(labels) for e in exprs) and all(
        requirement(f)(fields) for f in by_field
    )


def fit_reasons(spec: Obj, node: Obj, used: dict[str, float]) -> list[str]:
    """Why the pod does not fit the node (empty: it fits), the first failing filter's."""
    if node["spec"].get("unschedulable"):
        return ["node(s) were unschedulable"]
    if spec.get("nodeName") and spec["nodeName"] != node["metadata"]["name"]:
        return ["node(s) didn't match the requested node name"]
    taint = untolerated_taint(node["spec"].get("taints") or [], spec.get("tolerations") or [])
    if taint is not None:
        return [f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"]
    if not affinity_matches(spec, node):
        return ["node(s) didn't match Pod's node affinity/selector"]
    return _insufficient(pod_requests(spec), node, used)


def _insufficient(wanted: dict[str, float], node: Obj, used: dict[str, float]) -> list[str]:
    allocatable = {k: quantity(v) for k, v in node["status"]["allocatable"].items()}
    if used.get("pods", 0) + 1 > allocatable.get("pods", 110):
        return ["Too many pods"]
    order = ["cpu", "memory", "ephemeral-storage"]
    names = [n for n in order if n in wanted] + sorted(n for n in wanted if n not in order)
    return [
        f"Insufficient {name}"
        for name in names
        if wanted[name] > 0 and used.get(name, 0) + wanted[name] > allocatable.get(name, 0) + 1e-9
    ]


def fit_error(reasons: dict[str, list[str]]) -> str:
    """The scheduler's message for a pod no node fits (``reasons`` by node)."""
    n = len(reasons)
    if n == 0:
        return "no nodes available to schedule pods"
    histogram: Counter[str] = Counter(r for found in reasons.values() for r in found)
    preemption: Counter[str] = Counter(
        NO_VICTIMS
        if all(r.startswith(("Insufficient", "Too many")) for r in found)
        else NOT_HELPFUL
        for found in reasons.values()
    )
    return (
        f"0/{n} nodes are available: {_sorted(histogram)}. "
        f"preemption: 0/{n} nodes are available: {_sorted(preemption)}."
    )


def _sorted(histogram: Counter[str]) -> str:
    return ", ".join(sorted(f"{count} {reason}" for reason, count in histogram.items()))


def choose(
    spec: Obj, nodes: list[Obj], used: dict[str, dict[str, float]]
) -> tuple[str | None, str]:
    """(the node the pod goes to, "") or (None, the scheduler's message)."""
    reasons = {
        n["metadata"]["name"]: fit_reasons(spec, n, used.get(n["metadata"]["name"], {}))
        for n in nodes
    }
    fitting = [n for n in nodes if not reasons[n["metadata"]["name"]]]
    if not fitting:
        return None, fit_error(reasons)

    def allocated(node: Obj) -> tuple[float, str]:
        name = node["metadata"]["name"]
        alloc = {k: quantity(v) for k, v in node["status"]["allocatable"].items()}
        mine = used.get(name, {})
        share = [mine.get(k, 0) / alloc[k] for k in ("cpu", "memory") if alloc.get(k)]
        return (sum(share), name)

    return min(fitting, key=allocated)["metadata"]["name"], ""


def node_object(node: NodeSpec, address: str) -> Obj:
    """The ``Node`` the API shows for a :class:`NodeSpec`: Ready, its taints and
    allocatable (capacity the same)."""
    spec: Obj = {"taints": [dict(t) for t in node.taints]} if node.taints else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": {"kubernetes.io/hostname": node.name, **node.labels},
        },
        "spec": spec,
        "status": {
            "capacity": dict(node.allocatable),
            "allocatable": dict(node.allocatable),
            "conditions": [
                ready_condition("True", "KubeletReady", "kubelet is posting ready status")
            ],
            "addresses": [
                {"type": "InternalIP", "address": address},
                {"type": "Hostname", "address": node.name},
            ],
        },
    }


def ready_condition(status: str, reason: str, message: str) -> Obj:
    at = now_iso()
    return {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": at,
        "lastTransitionTime": at,
    }
