"""RunPod's REST API v2 schema as a validator: requests and responses checked by a library.

Loads the reduced copy of RunPod's OpenAPI document (``runpod_openapi_v2.json``, made by
``scripts/reduce_openapi.py``) into a ``referencing`` registry and checks bodies,
query and path parameters with ``jsonschema``'s :class:`Draft202012Validator`
(``unevaluatedProperties``, ``if``/``then``, ``oneOf`` and ``$ref`` as the document
writes them). Every check is a ``$ref`` to a JSON pointer inside the one registered
document, so a ``$ref: #/components/schemas/...`` anywhere resolves against it.

Errors are one line each, ``<where>: <message>``, where ``<where>`` is the JSON path
in the body (``$``, ``$.gpu``) or ``query.<name>`` / ``path.<name>``, as RunPod's
problem responses list them in ``errors``. Formats are checked where ``jsonschema``
can without optional packages (not ``date-time`` or ``uri`` here).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SCHEMA_PATH = Path(__file__).with_name("runpod_openapi_v2.json")
DOCUMENT_URI = "urn:runpod:openapi-v2"
METHODS = ("get", "put", "post", "patch", "delete")
_PARAM = re.compile(r"\{([^}/]+)\}")


def _pointer(*parts: str) -> str:
    escaped = (p.replace("~", "~0").replace("/", "~1") for p in parts)
    return "/" + "/".join(escaped)


@dataclass(frozen=True)
class Parameter:
    """One declared query, path or header parameter."""

    name: str
    where: str
    required: bool
    explode: bool
    pointer: str
    """JSON pointer to its schema in the document."""


@dataclass(frozen=True)
class Operation:
    """One method on one path template, with pointers to its schemas."""

    method: str
    template: str
    parameters: tuple[Parameter, ...]
    body: dict[str, str] | None
    """Media type -> pointer to the request body schema (None: the operation takes none)."""
    body_required: bool
    responses: dict[str, dict[str, str]]
    """Status (or ``default``) -> media type -> pointer to the response schema."""


@dataclass(frozen=True)
class RequestCheck:
    """What :meth:`RunPodSchema.check_request` found: the errors RunPod would refuse
    the request for, and the query parameters its schema does not declare."""

    errors: list[str]
    unknown_query: list[str]


class RunPodSchema:
    """The operations of the reduced document and their validators."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.source = str(document.get("x-source", ""))
        resource = Resource.from_contents(document, default_specification=DRAFT202012)
        self._registry: Registry[Any] = Registry().with_resource(DOCUMENT_URI, resource)
        self._validators: dict[str, Draft202012Validator] = {}
        self.operations: dict[tuple[str, str], Operation] = {}
        for template, item in document["paths"].items():
            for method in METHODS:
                if method in item:
                    self.operations[(method.upper(), template)] = self._operation(
                        template, method, item
                    )
        templates: list[str] = sorted(document["paths"])
        self._patterns: list[tuple[re.Pattern[str], str]] = sorted(
            ((_template_regex(t), t) for t in templates),
            key=lambda pair: (pair[1].count("{"), -len(pair[1])),
        )

    @classmethod
    def load(cls, path: Path = SCHEMA_PATH) -> RunPodSchema:
        return cls(json.loads(path.read_text(encoding="utf-8")))

    def _operation(self, template: str, method: str, item: dict[str, Any]) -> Operation:
        op = item[method]
        params: dict[tuple[str, str], Parameter] = {}
        for owner, raw in ((("paths", template), item), (("paths", template, method), op)):
            for i, p in enumerate(raw.get("parameters", [])):
                pointer = _pointer(*owner, "parameters", str(i), "schema")
                explode = bool(p.get("explode", p.get("style", "form") == "form"))
                params[(p["name"], p["in"])] = Parameter(
                    p["name"], p["in"], bool(p.get("required")), explode, pointer
                )
        body = op.get("requestBody")
        media = None
        if body is not None:
            at = ("paths", template, method, "requestBody", "content")
            media = {m: _pointer(*at, m, "schema") for m in body["content"]}
        responses = {
            status: {
                m: _pointer("paths", template, method, "responses", status, "content", m, "schema")
                for m in r["content"]
            }
            for status, r in op["responses"].items()
        }
        return Operation(
            method.upper(),
            template,
            tuple(params.values()),
            media,
            bool(body and body.get("required")),
            responses,
        )

    def _validator(self, pointer: str) -> Draft202012Validator:
        validator = self._validators.get(pointer)
        if validator is None:
            validator = Draft202012Validator(
                {"$ref": f"{DOCUMENT_URI}#{pointer}"},
                registry=self._registry,
                format_checker=Draft202012Validator.FORMAT_CHECKER,
            )
            self._validators[pointer] = validator
        return validator

    def errors(self, pointer: str, instance: Any, where: str = "$") -> list[str]:
        """Every way ``instance`` fails the schema at ``pointer``, one line each."""
        found = self._validator(pointer).iter_errors(instance)
        return [_line(e, where) for e in sorted(found, key=_order)]

    def template_of(self, method: str, path: str) -> str | None:
        """The path template that ``path`` (``/v2/pods/abc``) matches for ``method``
        (``/v2/pods/{id}``); literal segments win over parameters. None: no operation."""
        for regex, template in self._patterns:
            if regex.fullmatch(path) and (method.upper(), template) in self.operations:
                return template
        return None

    def path_params(self, template: str, path: str) -> dict[str, str]:
        found = _template_regex(template).fullmatch(path)
        return {} if found is None else dict(found.groupdict())

    def operation(self, method: str, template: str) -> Operation:
        op = self.operations.get((method.upper(), template))
        if op is None:
            raise KeyError(f"RunPod's schema has no {method.upper()} {template}")
        return op

    def check_request(
        self,
        method: str,
        template: str,
        body: Any,
        query: Mapping[str, Sequence[str]],
        path: Mapping[str, str] | None = None,
        media_type: str = "application/json",
    ) -> RequestCheck:
        """Check a request (``body`` parsed JSON, or None when there is none)."""
        op = self.operation(method, template)
        errors = self._params(op, "query", query) + self._params(
            op, "path", {k: [v] for k, v in (path or {}).items()}
        )
        errors += self._body(op, body, media_type)
        declared = {p.name for p in op.parameters if p.where == "query"}
        return RequestCheck(errors, sorted(set(query) - declared))

    def _params(self, op: Operation, where: str, given: Mapping[str, Sequence[str]]) -> list[str]:
        errors: list[str] = []
        for p in (p for p in op.parameters if p.where == where):
            raw = given.get(p.name)
            if not raw:
                if p.required:
                    errors.append(f"{where}.{p.name}: required")
                continue
            value = self._coerce(p, raw)
            errors += self.errors(p.pointer, value, f"{where}.{p.name}")
        return errors

    def _coerce(self, p: Parameter, raw: Sequence[str]) -> Any:
        """A query string value as the parameter's schema types it (form style)."""
        kind = self._type_at(p.pointer)
        if kind == "array":
            items = list(raw) if p.explode else [v for r in raw for v in r.split(",")]
            item_kind = self._type_at(p.pointer + "/items")
            return [_scalar(v, item_kind) for v in items]
        return _scalar(raw[-1], kind)

    def _type_at(self, pointer: str) -> str | None:
        node = self._registry.resolver(DOCUMENT_URI).lookup(f"#{pointer}").contents
        while isinstance(node, dict) and "$ref" in node and "type" not in node:
            node = self._registry.resolver(DOCUMENT_URI).lookup(node["$ref"]).contents
        kind = node.get("type") if isinstance(node, dict) else None
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), None)
        return kind if isinstance(kind, str) else None

    def _body(self, op: Operation, body: Any, media_type: str) -> list[str]:
        if op.body is None:
            return [] if body is None else ["$: this operation takes no request body"]
        if body is None:
            return ["$: a request body is required"] if op.body_required else []
        pointer = op.body.get(media_type)
        if pointer is None:
            return [f"$: media type {media_type} is not accepted (only {', '.join(op.body)})"]
        return self.errors(pointer, body)

    def check_response(
        self,
        method: str,
        template: str,
        status: int,
        body: Any,
        media_type: str | None = "application/json",
    ) -> list[str]:
        """Check a response: its status is declared (or ``default`` covers it), its media
        type is one the status declares, and ``body`` (None: no body) fits the schema."""
        op = self.operation(method, template)
        declared = op.responses.get(str(status))
        if declared is None:
            declared = op.responses.get("default")
            if declared is None or status < 400:
                return [f"status {status} is not declared for {method.upper()} {template}"]
        if not declared:
            return [] if body is None else [f"status {status} declares no body"]
        pointer = declared.get(media_type or "")
        if pointer is None:
            return [f"status {status} sends {', '.join(declared)}, not {media_type}"]
        return self.errors(pointer, body)


def _template_regex(template: str) -> re.Pattern[str]:
    parts = _PARAM.split(template)
    pattern = "".join(
        re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)" for i, part in enumerate(parts)
    )
    return re.compile(pattern)


def _scalar(text: str, kind: str | None) -> Any:
    """A query string as a JSON value of ``kind``; left a string when it is not one
    (the schema then names the mismatch)."""
    if kind == "integer" and re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    if kind == "number":
        try:
            return float(text)
        except ValueError:
            return text
    if kind == "boolean" and text in ("true", "false"):
        return text == "true"
    return text


def _order(error: ValidationError) -> tuple[str, str]:
    return (error.json_path, error.message)


def _line(error: ValidationError, where: str) -> str:
    path = error.json_path
    shown = where + path[1:] if where != "$" else path
    return f"{shown}: {error.message}"


@functools.cache
def default_schema() -> RunPodSchema:
    """The project's reduced copy of RunPod's v2 schema (loaded once)."""
    return RunPodSchema.load()


def validate_request(
    method: str, path_template: str, body: Any, query: Mapping[str, Sequence[str]] | None = None
) -> list[str]:
    """Why RunPod's schema refuses this request (empty: it accepts it)."""
    return default_schema().check_request(method, path_template, body, query or {}).errors


def validate_response(method: str, path_template: str, status: int, body: Any) -> list[str]:
    """Why this response breaks RunPod's schema (empty: it fits). Error statuses are
    checked as ``application/problem+json``, the rest as ``application/json``."""
    media: str | None = "application/problem+json" if status >= 400 else "application/json"
    if body is None:
        media = None
    return default_schema().check_response(method, path_template, status, body, media)
