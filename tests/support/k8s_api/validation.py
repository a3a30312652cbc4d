"""What the contract server checks in every object it receives: the Kubernetes
OpenAPI schema of its version (kubernetes-validate, strict: an unknown field is an
error), and that no private key travels outside a Secret's ``data``/``stringData``
(an annotation, an env value, a label: issue 31's Build point 5)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]

from tests.support.k8s_api.resources import Obj

PRIVATE_KEY_MARK = "PRIVATE KEY-----"
"""What every PEM private key holds (``-----BEGIN [EC |RSA ]PRIVATE KEY-----``)."""


def schema_problems(obj: Obj, version: str) -> list[tuple[str, str]]:
    """(field path, message) for each way ``obj`` breaks its kind's schema."""
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path) or "<root>"
        return [(path, str(exc.message))]
    except kubernetes_validate.SchemaNotFoundError:
        return [
            ("apiVersion", f"no schema for {obj.get('apiVersion')}/{obj.get('kind')} in {version}")
        ]
    return []


def private_key_places(obj: Obj) -> list[str]:
    """Paths where a PEM private key sits outside a Secret's ``data``/``stringData``
    (base64 text is decoded first, so a key hidden in base64 is found too)."""
    allowed = ("data", "stringData") if obj.get("kind") == "Secret" else ()
    return [
        path
        for path, value in _strings(obj, "")
        if path.split(".")[0] not in allowed and _holds_key(value)
    ]


def _strings(node: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _strings(value, f"{path}[{i}]")
    elif isinstance(node, str):
        yield path, node


def _holds_key(text: str) -> bool:
    if PRIVATE_KEY_MARK in text:
        return True
    compact = "".join(text.split())
    if len(compact) < 64:
        return False
    try:
        decoded = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        return False
    return PRIVATE_KEY_MARK.encode() in decoded
