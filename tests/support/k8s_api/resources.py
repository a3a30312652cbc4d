"""The REST resources the contract Kubernetes API server plays, and its error answers.

A resource is named by its group, version and plural as in its URL
(``/api/v1/namespaces/{ns}/pods``, ``/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets``);
an error is a ``Status`` object (``kind: Status``, ``status: Failure``, ``reason``,
``code``, ``details``), as the API conventions define it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class Resource:
    """One REST resource: where it lives and what it holds."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    has_status: bool = False
    """Whether ``status`` is a subresource (an apply or create ignores a given status)."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"


RESOURCES: tuple[Resource, ...] = (
    Resource("", "v1", "pods", "Pod", has_status=True),
    Resource("", "v1", "services", "Service", has_status=True),
    Resource("", "v1", "secrets", "Secret"),
    Resource("", "v1", "configmaps", "ConfigMap"),
    Resource("", "v1", "nodes", "Node", namespaced=False, has_status=True),
    Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy"),
    Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", has_status=True),
    Resource("apps", "v1", "deployments", "Deployment", has_status=True),
)
BY_KIND = {r.kind: r for r in RESOURCES}
BY_PATH = {(r.prefix, r.plural): r for r in RESOURCES}


class ApiStatus(Exception):
    """An answer that is a ``Status`` object (an error of the API)."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def body(self) -> Obj:
        return status_object(self.code, self.reason, self.message, self.details)


def status_object(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    out: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        out["details"] = details
    return out


def not_found(resource: Resource, name: str) -> ApiStatus:
    details = {"name": name, "group": resource.group, "kind": resource.plural}
    message = f'{_qualified(resource)} "{name}" not found'
    return ApiStatus(404, "NotFound", message, details)


def already_exists(resource: Resource, name: str) -> ApiStatus:
    details = {"name": name, "group": resource.group, "kind": resource.plural}
    message = f'{_qualified(resource)} "{name}" already exists'
    return ApiStatus(409, "AlreadyExists", message, details)


def invalid(resource: Resource, name: str, causes: list[tuple[str, str, str]]) -> ApiStatus:
    """422 ``Invalid``; ``causes``: (reason, field, message) each."""
    said = ", ".join(f"{field}: {message}" for _, field, message in causes)
    details = {
        "name": name,
        "group": resource.group,
        "kind": resource.kind,
        "causes": [{"reason": r, "field": f, "message": m} for r, f, m in causes],
    }
    return ApiStatus(422, "Invalid", f'{resource.kind} "{name}" is invalid: {said}', details)


def _qualified(resource: Resource) -> str:
    return f"{resource.plural}.{resource.group}" if resource.group else resource.plural
