"""RBAC as the API server authorises a request: a Role's ``rules`` (PolicyRules) allow a
verb on a resource of an API group, optionally only for some ``resourceNames``. The
verb of a request follows the API server's mapping: ``GET`` of one object is ``get``,
of a collection ``list`` (``watch`` with ``?watch=true``), ``POST`` ``create``,
``PUT`` ``update``, ``PATCH`` ``patch``, ``DELETE`` ``delete``. A refusal is the
server's 403 ``Forbidden`` with its message."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

Obj = dict[str, Any]
SERVICE_ACCOUNT = "system:serviceaccount:framerelay:framerelay-orchestrator"


@dataclass(frozen=True)
class Access:
    verb: str
    group: str
    resource: str
    namespace: str | None
    name: str | None


def request_verb(method: str, named: bool, watch: bool) -> str:
    if method == "GET":
        return "get" if named else ("watch" if watch else "list")
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
        method, method.lower()
    )


def _has(values: Sequence[str], wanted: str) -> bool:
    return "*" in values or wanted in values


def _rule_allows(rule: Obj, access: Access) -> bool:
    names = rule.get("resourceNames") or []
    return (
        _has(rule.get("apiGroups") or [], access.group)
        and _has(rule.get("resources") or [], access.resource)
        and _has(rule.get("verbs") or [], access.verb)
        and (not names or (access.name is not None and access.name in names))
    )


def allowed(rules: Sequence[Obj], access: Access) -> bool:
    return any(_rule_allows(rule, access) for rule in rules)


def forbidden_message(access: Access, user: str = SERVICE_ACCOUNT) -> str:
    """The API server's wording of a 403."""
    what = f'{access.resource} "{access.name}"' if access.name else access.resource
    where = f' in the namespace "{access.namespace}"' if access.namespace else ""
    return (
        f'{what} is forbidden: User "{user}" cannot {access.verb} resource '
        f'"{access.resource}" in API group "{access.group}"{where}'
    )


def role_rules(manifest: Path, role: str) -> list[Obj]:
    """The ``rules`` of the Role named ``role`` in a multi-document YAML manifest."""
    for doc in yaml.safe_load_all(manifest.read_text()):
        if doc and doc.get("kind") == "Role" and doc["metadata"]["name"] == role:
            return list(doc["rules"])
    raise LookupError(f"no Role {role!r} in {manifest}")
