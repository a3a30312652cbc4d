"""Reduce RunPod's OpenAPI v2 document to its structure, for the contract server.

Reads RunPod's published schema (``../shared/reference/runpod/openapi-v2.json`` by
default) and writes ``bench/rig/runpod_openapi_v2.json``: the paths, their methods,
parameters (name, in, required, style, explode, schema), request bodies and responses by
status and media type, and ``components.schemas``, keeping every JSON Schema keyword
that validates (type, properties, required, enum, const, items, $ref, allOf/anyOf/oneOf,
not, if/then/else, additionalProperties, unevaluatedProperties, format, bounds,
patterns, ...) and dropping what only documents (descriptions, examples, titles,
defaults, discriminators, x- extensions, headers). ``$ref`` to shared parameters and
responses are inlined; ``$ref`` to schemas stay. A keyword this script does not know
stops it, so nothing that validates is dropped unnoticed.

The output is deterministic (sorted keys) and names its source in ``x-source``: the
file, RunPod's docs repository commit (from ``SOURCE.txt`` beside it), the file's
sha256, and this script. ``tests/deploy/test_runpod_contract_server.py`` checks that the
committed copy equals this script's output.

Usage: ``python scripts/reduce_openapi.py [SOURCE] [--out PATH]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = ROOT.parent / "shared" / "reference" / "runpod" / "openapi-v2.json"
DEFAULT_OUT = ROOT / "bench" / "rig" / "runpod_openapi_v2.json"
SCRIPT = "scripts/reduce_openapi.py"

METHODS = ("get", "put", "post", "patch", "delete")
KEPT_AS_IS = frozenset(
    {
        "type",
        "required",
        "enum",
        "const",
        "format",
        "$ref",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minContains",
        "maxContains",
        "minProperties",
        "maxProperties",
        "dependentRequired",
        "nullable",
    }
)
"""Keywords whose values are not schemas: kept unchanged."""
ONE_SCHEMA = frozenset(
    {
        "items",
        "not",
        "if",
        "then",
        "else",
        "contains",
        "propertyNames",
        "additionalProperties",
        "unevaluatedProperties",
        "unevaluatedItems",
    }
)
"""Keywords whose value is a schema (or a boolean schema)."""
SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
SCHEMA_MAPS = frozenset({"properties", "patternProperties", "dependentSchemas", "$defs"})
DOCUMENTATION = frozenset(
    {
        "description",
        "examples",
        "example",
        "title",
        "default",
        "deprecated",
        "readOnly",
        "writeOnly",
        "discriminator",
        "externalDocs",
        "xml",
        "$comment",
        "summary",
    }
)
"""Keywords that only document: dropped (``x-*`` extensions too)."""


class ReduceError(Exception):
    """The source cannot be reduced faithfully (an unknown keyword, a dangling $ref)."""


def reduce_schema(schema: Any, where: str) -> Any:
    """``schema`` with only its validating keywords (recursively)."""
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict):
        raise ReduceError(f"{where}: a schema must be an object or a boolean")
    out: dict[str, Any] = {}
    for key, value in schema.items():
        at = f"{where}/{key}"
        if key in KEPT_AS_IS:
            out[key] = value
        elif key in ONE_SCHEMA:
            out[key] = reduce_schema(value, at)
        elif key in SCHEMA_LISTS:
            out[key] = [reduce_schema(v, f"{at}/{i}") for i, v in enumerate(value)]
        elif key in SCHEMA_MAPS:
            out[key] = {name: reduce_schema(v, f"{at}/{name}") for name, v in value.items()}
        elif key not in DOCUMENTATION and not key.startswith("x-"):
            raise ReduceError(f"{at}: unknown schema keyword {key!r} (add it to the script)")
    return out


class Reducer:
    """Walks one OpenAPI document; shared parameters and responses are inlined."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.components: dict[str, Any] = spec.get("components", {})

    def _deref(self, item: dict[str, Any], kind: str) -> dict[str, Any]:
        ref = item.get("$ref")
        if ref is None:
            return item
        prefix = f"#/components/{kind}/"
        if not isinstance(ref, str) or not ref.startswith(prefix):
            raise ReduceError(f"$ref {ref!r} is not under {prefix}")
        target = self.components.get(kind, {}).get(ref.removeprefix(prefix))
        if not isinstance(target, dict):
            raise ReduceError(f"$ref {ref!r} names nothing")
        return target

    def parameter(self, raw: dict[str, Any], where: str) -> dict[str, Any]:
        p = self._deref(raw, "parameters")
        kept = ("name", "in", "required", "style", "explode")
        out: dict[str, Any] = {k: p[k] for k in kept if k in p}
        out["schema"] = reduce_schema(p.get("schema", {}), f"{where}/schema")
        return out

    def content(self, raw: dict[str, Any], where: str) -> dict[str, Any]:
        return {
            media: {"schema": reduce_schema(body.get("schema", {}), f"{where}/{media}/schema")}
            for media, body in raw.items()
        }

    def response(self, raw: dict[str, Any], where: str) -> dict[str, Any]:
        r = self._deref(raw, "responses")
        return {"content": self.content(r.get("content", {}), f"{where}/content")}

    def operation(self, raw: dict[str, Any], where: str) -> dict[str, Any]:
        out: dict[str, Any] = {"operationId": raw.get("operationId")}
        params = raw.get("parameters", [])
        out["parameters"] = [self.parameter(p, f"{where}/parameters") for p in params]
        body = raw.get("requestBody")
        if body is not None:
            body = self._deref(body, "requestBodies")
            out["requestBody"] = {
                "required": bool(body.get("required", False)),
                "content": self.content(body.get("content", {}), f"{where}/requestBody"),
            }
        responses = raw.get("responses", {})
        out["responses"] = {
            str(status): self.response(r, f"{where}/responses/{status}")
            for status, r in responses.items()
        }
        return out

    def path_item(self, raw: dict[str, Any], where: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if "parameters" in raw:
            out["parameters"] = [
                self.parameter(p, f"{where}/parameters") for p in raw["parameters"]
            ]
        for method in METHODS:
            if method in raw:
                out[method] = self.operation(raw[method], f"{where}/{method}")
        return out

    def document(self, source_line: str) -> dict[str, Any]:
        schemas = self.components.get("schemas", {})
        reduced: dict[str, Any] = {
            "x-source": source_line,
            "openapi": self.spec.get("openapi"),
            "security": self.spec.get("security", []),
            "paths": {p: self.path_item(v, p) for p, v in self.spec.get("paths", {}).items()},
            "components": {
                "schemas": {
                    n: reduce_schema(s, f"#/components/schemas/{n}") for n, s in schemas.items()
                }
            },
        }
        check_refs(reduced)
        return reduced


def check_refs(document: dict[str, Any]) -> None:
    """Every ``$ref`` left names a schema that is there."""
    schemas = document["components"]["schemas"]

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                name = ref.removeprefix("#/components/schemas/")
                if name == ref or name not in schemas:
                    raise ReduceError(f"$ref {ref!r} names no schema of the reduced document")
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(document)


def source_line(source: Path, data: bytes) -> str:
    """The ``x-source`` line: file, RunPod docs commit (``SOURCE.txt``), sha256, script."""
    notes = source.with_name("SOURCE.txt")
    try:
        text = notes.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReduceError(f"cannot read {notes} (it names the docs commit): {exc}") from exc
    found = re.search(r"commit ([0-9a-f]{40})", text)
    if found is None:
        raise ReduceError(f"{notes} names no 40-hex commit")
    # beside the checkout, as given (not through links: the shared folder may be one)
    shown = Path(os.path.relpath(os.path.abspath(source), ROOT)).as_posix()
    digest = hashlib.sha256(data).hexdigest()
    return (
        f"{shown} (runpod/docs commit {found.group(1)}, api-reference-v2/openapi.json; "
        f"sha256 {digest}) reduced to its structure by {SCRIPT}"
    )


def render(source: Path) -> str:
    """The reduced document for ``source``, as the text the script writes."""
    data = source.read_bytes()
    spec = json.loads(data)
    reduced = Reducer(spec).document(source_line(source, data))
    return json.dumps(reduced, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None, out: Callable[[str], object] = print) -> int:
    parser = argparse.ArgumentParser(description="Reduce RunPod's OpenAPI v2 document.")
    parser.add_argument("source", nargs="?", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    try:
        text = render(args.source)
    except (OSError, ValueError, ReduceError) as exc:
        print(f"reduce_openapi: {exc}", file=sys.stderr)
        return 1
    args.out.write_text(text, encoding="utf-8")
    out(f"wrote {args.out} ({len(text)} bytes) from {args.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
