"""Server-side apply and JSON merge patch, as the API server does them for one object.

Server-side apply (``PATCH`` with ``application/apply-patch+yaml`` and a
``fieldManager``): the applied configuration is merged over the live object; fields
this manager applied before and no longer applies are removed (unless another
manager applied them too); a field another manager applied with a different value
is a conflict (409 ``Conflict``, one cause per field) unless ``force=true``, which
takes it over. Maps merge key by key; lists are atomic (replaced whole), which is
what the API does for most lists of a single manager. ``metadata.managedFields``
records each manager's fields (``FieldsV1``). No ``last-applied-configuration``
annotation is ever written (that is client-side ``kubectl apply``).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from tests.support.k8s_api.resources import ApiStatus, Obj
from tests.support.k8s_api.store import now_iso

Path = tuple[str, ...]
SERVER_OWNED = (
    "metadata.uid",
    "metadata.resourceVersion",
    "metadata.creationTimestamp",
    "metadata.managedFields",
    "metadata.generation",
    "metadata.namespace",
    "metadata.deletionTimestamp",
    "metadata.deletionGracePeriodSeconds",
)


def leaves(node: Any, prefix: Path = ()) -> dict[Path, Any]:
    """Every leaf of ``node`` by path (a list is one leaf)."""
    if isinstance(node, dict) and node:
        out: dict[Path, Any] = {}
        for key, value in node.items():
            out.update(leaves(value, (*prefix, str(key))))
        return out
    return {prefix: node}


def _owned(path: Path) -> bool:
    return ".".join(path) in SERVER_OWNED or path[:1] == ("status",)


def conflicts(config: Obj, manager: str, others: dict[str, Obj]) -> list[tuple[str, Path]]:
    """(other manager, path) for each field ``config`` sets differently from what
    another manager applied."""
    mine = leaves(config)
    found = []
    for other, applied in sorted(others.items()):
        if other == manager:
            continue
        for path, value in leaves(applied).items():
            if path in mine and mine[path] != value and not _owned(path):
                found.append((other, path))
    return found


def conflict_error(found: list[tuple[str, Path]], api_version: str) -> ApiStatus:
    causes = [
        {
            "reason": "FieldManagerConflict",
            "message": f'conflict with "{m}" using {api_version}',
            "field": "." + ".".join(p),
        }
        for m, p in found
    ]
    lines = "\n".join(f"- {c['message']}: {c['field']}" for c in causes)
    count = f"{len(found)} conflict" + ("s" if len(found) > 1 else "")
    message = (
        f"Apply failed with {count}: {lines}"
        if len(found) > 1
        else (f"Apply failed with 1 conflict: {causes[0]['message']}: {causes[0]['field']}")
    )
    return ApiStatus(409, "Conflict", message, {"causes": causes})


def merge(base: Any, over: Any) -> Any:
    """Maps merge key by key, anything else is replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = merge(base.get(key), value) if key in base else copy.deepcopy(value)
        return out
    return copy.deepcopy(over)


def remove(obj: Obj, path: Path) -> None:
    if not path:
        return
    node: Any = obj
    for key in path[:-1]:
        if not isinstance(node, dict) or key not in node:
            return
        node = node[key]
    if isinstance(node, dict):
        node.pop(path[-1], None)


def apply(live: Obj, config: Obj, before: Obj | None, others: dict[str, Obj]) -> Obj:
    """``live`` with ``config`` applied by a manager that applied ``before`` last time."""
    out = copy.deepcopy(live)
    still = {p for m in others.values() for p in leaves(m)}
    for path in set(leaves(before or {})) - set(leaves(config)) - still:
        if path and not _owned(path):
            remove(out, path)
    return dict(merge(out, config))


def merge_patch(live: Obj, patch: Any) -> Obj:
    """RFC 7386 JSON merge patch (``application/merge-patch+json``)."""
    if not isinstance(patch, dict):
        raise ApiStatus(400, "BadRequest", "a merge patch must be a JSON object")
    return dict(_merge_patch(live, patch))


def _merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge_patch(out.get(key), value)
    return out


def fields_v1(node: Any) -> Obj:
    """The ``FieldsV1`` set of a configuration (``f:<field>``; lists of named items
    as ``k:{"name":...}``)."""
    if isinstance(node, dict):
        return {f"f:{k}": fields_v1(v) for k, v in node.items()}
    if isinstance(node, list) and node and all(isinstance(i, dict) and "name" in i for i in node):
        return {
            "k:" + json.dumps({"name": i["name"]}, separators=(",", ":")): {".": {}, **fields_v1(i)}
            for i in node
        }
    return {}


def managed_entry(
    manager: str, operation: str, api_version: str, config: Obj, sub: str = ""
) -> Obj:
    shown = {k: v for k, v in config.items() if k not in ("apiVersion", "kind")}
    meta = {k: v for k, v in shown.get("metadata", {}).items() if k in ("labels", "annotations")}
    if "metadata" in shown:
        shown["metadata"] = meta
        if not meta:
            shown.pop("metadata")
    entry: Obj = {
        "manager": manager,
        "operation": operation,
        "apiVersion": api_version,
        "time": now_iso(),
        "fieldsType": "FieldsV1",
        "fieldsV1": fields_v1(shown),
    }
    if sub:
        entry["subresource"] = sub
    return entry
