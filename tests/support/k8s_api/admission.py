"""What the API server does to an object between validation and storage: defaults
(a pod's ``restartPolicy``, its containers' ``imagePullPolicy``, the
DefaultTolerationSeconds tolerations for ``not-ready``/``unreachable``; a Service's
``clusterIP``; a Secret's ``stringData`` folded into ``data``), the
ExtendedResourceToleration admission plugin when it is on, and the fields of a pod
that an update may not change."""

from __future__ import annotations

import base64
import copy
import itertools
from typing import Any

from tests.support.k8s_api.resources import BY_KIND, Obj, invalid

EXTENDED_PREFIXES = ("nvidia.com/", "amd.com/", "aliyun.com/", "habana.ai/")
DEFAULT_TOLERATIONS = (
    {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
    {
        "key": "node.kubernetes.io/unreachable",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
)
POD_UPDATE_FORBIDDEN = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
    "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
    "(allow it to be set to 1 if it was previously negative)"
)
_cluster_ips = itertools.count(10)


def defaulted(obj: Obj, kind: str, *, extended_resource_toleration: bool) -> Obj:
    """``obj`` with the server's defaults (idempotent: an update is defaulted again
    after its merge, as the API server does)."""
    out = copy.deepcopy(obj)
    if kind == "Pod":
        _pod_defaults(out["spec"], extended_resource_toleration)
        out.setdefault("status", {"phase": "Pending", "qosClass": qos_class(out["spec"])})
    elif kind == "Secret":
        fold_string_data(out)
    elif kind == "Service":
        _service_defaults(out["spec"])
    return out


def fold_string_data(secret: Obj) -> None:
    """``stringData`` is write-only: it lands base64-encoded in ``data``."""
    secret.setdefault("type", "Opaque")
    for key, value in (secret.pop("stringData", None) or {}).items():
        secret.setdefault("data", {})[key] = base64.b64encode(str(value).encode()).decode()


def _pod_defaults(spec: Obj, extended_toleration: bool) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("serviceAccountName", "default")
    tolerations = spec.setdefault("tolerations", [])
    keys = {t.get("key") for t in tolerations}
    tolerations += [dict(t) for t in DEFAULT_TOLERATIONS if t["key"] not in keys]
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        tag = c["image"].rpartition("/")[2]
        latest = ":" not in tag or tag.endswith(":latest")
        c.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
        for port in c.get("ports", []):
            port.setdefault("protocol", "TCP")
    if extended_toleration:
        for name in sorted(extended_resources(spec)):
            if not any(t.get("key") == name for t in tolerations):
                tolerations.append({"key": name, "operator": "Exists", "effect": "NoSchedule"})


def extended_resources(spec: Obj) -> set[str]:
    return {
        name
        for c in spec["containers"]
        for part in ("requests", "limits")
        for name in (c.get("resources", {}).get(part) or {})
        if name.startswith(EXTENDED_PREFIXES)
    }


def qos_class(spec: Obj) -> str:
    resources = [c.get("resources", {}) for c in spec["containers"]]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    guaranteed = all(
        {"cpu", "memory"} <= set(r.get("limits") or {})
        and all(
            (r.get("requests") or r["limits"]).get(k) == r["limits"][k] for k in ("cpu", "memory")
        )
        for r in resources
    )
    return "Guaranteed" if guaranteed else "Burstable"


def _service_defaults(spec: Obj) -> None:
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if "clusterIP" not in spec:
        n = next(_cluster_ips)
        spec["clusterIP"] = f"10.96.{n // 250}.{n % 250 + 1}"
    if spec["clusterIP"] != "None":
        spec["clusterIPs"] = [spec["clusterIP"]]
    for port in spec.get("ports", []):
        port.setdefault("protocol", "TCP")
        port.setdefault("targetPort", port["port"])


def check_pod_update(name: str, live: Obj, new: Obj) -> None:
    """422 when an update changes what a pod may not change."""
    if _mutable_view(live["spec"]) != _mutable_view(new["spec"]):
        cause = ("FieldValueForbidden", "spec", f"Forbidden: {POD_UPDATE_FORBIDDEN}")
        raise invalid(BY_KIND["Pod"], name, [cause])
    old_tolerations = live["spec"].get("tolerations", [])
    if any(t not in new["spec"].get("tolerations", []) for t in old_tolerations):
        cause = (
            "FieldValueForbidden",
            "spec.tolerations",
            "Forbidden: existing toleration can not be modified except its tolerationSeconds",
        )
        raise invalid(BY_KIND["Pod"], name, [cause])


def _mutable_view(spec: Obj) -> Any:
    out = copy.deepcopy(spec)
    for field in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds"):
        out.pop(field, None)
    for c in [*out.get("initContainers", []), *out.get("containers", [])]:
        c.pop("image", None)
    return out
