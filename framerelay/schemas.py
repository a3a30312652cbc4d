"""Messages of the results API, defined once, and their published schemas.

The WebSocket API ``WS /v1/results`` takes a :class:`Subscription` (query
parameters) and sends JSON text messages, each with a ``type``:
``subscribed`` (first), ``result``, ``notice`` and ``error``. Recording
sidecars hold :class:`SidecarLine` values. ``docs/schemas/`` holds JSON Schema
and AsyncAPI documents generated from these models; regenerate them with
``python -m framerelay.schemas --write`` (``--check`` is what the drift test
runs). Every message carries ``v``; within a version, changes are additive.

Readers ignore what they do not know: the messages the hub sends and the
sidecar lines are ``extra="ignore"``, and :func:`read_server_message` also
ignores unknown fields inside the echoed subscription. What users send
(:class:`Subscription`) stays strict (``extra="forbid"``).
"""

from __future__ import annotations

import argparse
import enum
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter
from pydantic.json_schema import models_json_schema

from framerelay.results import ID_PATTERN, SCHEMA_VERSION, ResultId, ResultRecord

STREAM_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
DURABLE_ID_PATTERN = ID_PATTERN
RESUME_PATTERN = r"^.+@[0-9]+-[0-9]+$"
StreamId = Annotated[str, StringConstraints(pattern=STREAM_ID_PATTERN)]
_READER = ConfigDict(extra="ignore", frozen=True)
SCHEMA_DIR = Path(__file__).resolve().parents[1] / "docs" / "schemas"


class CloseCode(enum.IntEnum):
    """WebSocket close codes the hub uses once a connection is open."""

    NORMAL = 1000
    GOING_AWAY = 1001
    TOO_BIG = 1009
    KEEPALIVE_TIMEOUT = 1011
    BAD_REQUEST = 4400
    TOKEN_EXPIRED = 4401
    FORBIDDEN = 4403
    TOO_SLOW = 4408


ErrorCode = Literal[
    "bad_request",
    "unauthorized",
    "token_expired",
    "forbidden",
    "capacity",
    "too_slow",
    "throttled",
]


class Subscription(BaseModel):
    """What a subscriber asks for: the query parameters of ``WS /v1/results``.

    Query form: ``?stream=cam-1&stream=cam-2&class=person&min_confidence=0.5
    &resume=cam-1@1712345678901-0``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    streams: list[StreamId] = Field(
        default_factory=list,
        max_length=256,
        description="Streams to receive (query: stream, repeatable). Empty means every "
        "stream and needs a token granting results:*.",
    )
    classes: list[Annotated[str, StringConstraints(min_length=1, max_length=64)]] | None = Field(
        None,
        max_length=100,
        description="Only detections of these class names (query: class, repeatable or "
        "comma-separated). Results with no matching detection are still sent, empty.",
    )
    min_confidence: float = Field(
        0.0, ge=0.0, le=1.0, description="Only detections at or above this confidence."
    )
    resume: dict[StreamId, ResultId] = Field(
        default_factory=dict,
        description="Per stream, the last durable id seen (query: resume=<stream>@<id>): "
        "results after it are replayed before live ones.",
    )


class SubscribedMessage(BaseModel):
    """First message after the handshake: the subscription as the hub applies it."""

    model_config = _READER

    type: Literal["subscribed"] = "subscribed"
    v: int = SCHEMA_VERSION
    subscription: Subscription
    queue_size: int = Field(description="Results buffered for this subscriber; beyond, the "
                            "oldest is dropped and counted in `dropped`.")  # fmt: skip
    send_timeout_s: float = Field(description="A send blocked this long closes the "
                                  "connection with 4408.")  # fmt: skip
    expires_at: float | None = Field(
        None, description="Unix time the token expires (the hub then closes with 4401)."
    )
    replay: dict[str, int] = Field(
        default_factory=dict, description="Per resumed stream, results about to be replayed."
    )
    durable: bool = Field(description="True when results are also kept in Redis Streams.")


class ResultMessage(ResultRecord):
    """One result (the fields of :class:`ResultRecord`) plus delivery bookkeeping."""

    type: Literal["result"] = "result"
    dropped: int = Field(
        0, ge=0, description="Results dropped for this subscriber so far (its queue was full)."
    )

    @classmethod
    def of(cls, record: ResultRecord, dropped: int = 0) -> ResultMessage:
        """``record`` as a message (no re-validation: ``record`` is valid already)."""
        if dropped < 0:
            raise ValueError(f"dropped must be >= 0, got {dropped}")
        fields = {name: getattr(record, name) for name in ResultRecord.model_fields}
        return cls.model_construct(
            record.model_fields_set | {"type", "dropped"}, **fields, type="result", dropped=dropped
        )


_DROPPED_TAIL = '"dropped":0}'


@dataclass(frozen=True, slots=True)
class SharedResultMessage:
    """A :class:`ResultMessage` encoded once for every subscriber: they differ only in
    ``dropped``, the last field, so each one's text is the shared head plus its count.
    ``text(n)`` is exactly ``ResultMessage.of(record, n).model_dump_json()``."""

    message: ResultMessage
    head: str | None

    @classmethod
    def of(cls, record: ResultRecord) -> SharedResultMessage:
        message = ResultMessage.of(record)
        text = message.model_dump_json()
        head = text[: -len("0}")] if text.endswith(_DROPPED_TAIL) else None
        return cls(message, head)

    def text(self, dropped: int) -> str:
        if self.head is not None and dropped >= 0:
            return f"{self.head}{dropped}}}"
        return ResultMessage.of(self.message, dropped).model_dump_json()


class NoticeMessage(BaseModel):
    """Something the subscriber should know that is not a result."""

    model_config = _READER

    type: Literal["notice"] = "notice"
    v: int = SCHEMA_VERSION
    code: Literal["dropped", "gap"] = Field(
        description="dropped: results were dropped for this subscriber since the last notice; "
        "gap: a resume point is older than the hub or Redis still holds."
    )
    message: str
    stream_id: str | None = None
    dropped: int = Field(0, ge=0, description="Total dropped for this subscriber so far.")


class ErrorMessage(BaseModel):
    """Why a connection is refused (HTTP body) or about to close (last message)."""

    model_config = _READER

    type: Literal["error"] = "error"
    v: int = SCHEMA_VERSION
    code: ErrorCode
    message: str
    http_status: int | None = Field(None, description="Set when the handshake was refused.")
    close_code: int | None = Field(None, description="Set when the connection is closing.")


ServerMessage = Annotated[
    SubscribedMessage | ResultMessage | NoticeMessage | ErrorMessage,
    Field(discriminator="type"),
]
SERVER_MESSAGE: TypeAdapter[SubscribedMessage | ResultMessage | NoticeMessage | ErrorMessage] = (
    TypeAdapter(ServerMessage)
)


def read_server_message(
    raw: str | bytes,
) -> SubscribedMessage | ResultMessage | NoticeMessage | ErrorMessage:
    """A message from the hub, ignoring fields this reader does not know (a newer hub may
    send more within a version). ValidationError when it is not one of ours."""
    return SERVER_MESSAGE.validate_json(raw, extra="ignore")


class SidecarLine(BaseModel):
    """One line of a recording sidecar: a result placed on a segment's own timeline."""

    model_config = _READER

    v: int = SCHEMA_VERSION
    id: ResultId = Field(description="The result's durable id (unique across sidecars).")
    segment: str | None = Field(description="Segment file name, or None in a gap file.")
    pts: int | None = Field(description="PTS of the matching frame in the segment file.")
    time_base: tuple[int, int] | None = Field(description="Time base of `pts`.")
    exact: bool = Field(
        description="True when the frame was matched by PTS, false when by wall clock."
    )
    result: ResultRecord


HTTP_STATUS = {
    "bad_request": 400, "unauthorized": 401, "token_expired": 401, "forbidden": 403,
    "throttled": 429, "capacity": 503, "too_slow": 503,
}  # fmt: skip
"""HTTP status of a refused handshake, by error code."""

_MESSAGES: tuple[type[BaseModel], ...] = (
    SubscribedMessage,
    ResultMessage,
    NoticeMessage,
    ErrorMessage,
)


def _dump(doc: object) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def _defs() -> dict[str, Any]:
    models = [(m, "serialization") for m in (*_MESSAGES, Subscription)]
    _, top = models_json_schema(models, ref_template="#/components/schemas/{model}")  # type: ignore[arg-type]
    defs: dict[str, Any] = top["$defs"]
    return defs


def _query_schema() -> dict[str, Any]:
    props = Subscription.model_json_schema()["properties"]
    return {
        "type": "object",
        "properties": {
            "stream": {"type": "array", "items": {"type": "string", "pattern": STREAM_ID_PATTERN},
                       "description": props["streams"]["description"]},
            "class": {"type": "array", "items": {"type": "string"},
                      "description": props["classes"]["description"]},
            "min_confidence": {"type": "number", "minimum": 0, "maximum": 1,
                               "description": props["min_confidence"]["description"]},
            "resume": {"type": "array", "items": {"type": "string", "pattern": RESUME_PATTERN},
                       "description": props["resume"]["description"]},
        },
    }  # fmt: skip


def asyncapi() -> dict[str, Any]:
    """The AsyncAPI 3.0 document of ``WS /v1/results``."""
    names = {m.__name__: m.model_fields["type"].default for m in _MESSAGES}
    messages = {
        tag: {"name": tag, "title": name, "contentType": "application/json",
              "payload": {"$ref": f"#/components/schemas/{name}"},
              "summary": _summary(_model(name))}
        for name, tag in names.items()
    }  # fmt: skip
    ws_binding = {
        "method": "GET",
        "query": _query_schema(),
        "headers": {
            "type": "object",
            "required": ["Authorization"],
            "properties": {"Authorization": {"type": "string", "pattern": "^Bearer .+$"}},
        },
    }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "framerelay results API",
            "version": str(SCHEMA_VERSION),
            "description": (
                "Live, PTS-aligned detection results per stream. Authenticate with "
                "'Authorization: Bearer <token>': a JWT for audience framerelay-ingest "
                "granting results:<id> (or results:*). Served over wss:// when the ingest has "
                "api_tls_cert. Refusals before the handshake completes: HTTP 400 bad "
                "subscription, 401 missing/malformed/badly signed/expired/not yet valid/"
                "wrong-audience token, 403 stream not granted, 429 too many failed "
                "authentications from this address (Retry-After), 503 too many subscribers; "
                "the body is an ErrorMessage. Close codes after "
                "it: " + ", ".join(f"{c.value} {c.name.lower()}" for c in CloseCode) + "."
            ),
        },
        "servers": {"ingest": {"host": "localhost:8080", "protocol": "ws"}},
        "channels": {
            "results": {
                "address": "/v1/results",
                "messages": {t: {"$ref": f"#/components/messages/{t}"} for t in messages},
                "bindings": {"ws": ws_binding},
            }
        },
        "operations": {
            "receiveResults": {
                "action": "receive",
                "channel": {"$ref": "#/channels/results"},
                "messages": [{"$ref": f"#/channels/results/messages/{t}"} for t in messages],
            }
        },
        "components": {"messages": messages, "schemas": _defs()},
    }


def _summary(model: type[BaseModel]) -> str:
    lines = (model.__doc__ or model.__name__).strip().splitlines()
    return lines[0] if lines else model.__name__


def _model(name: str) -> type[BaseModel]:
    return next(m for m in _MESSAGES if m.__name__ == name)


def render_all() -> dict[str, str]:
    """Every generated document, by file name."""

    def standalone(model: type[BaseModel]) -> str:
        doc = model.model_json_schema(mode="serialization")
        return _dump({"$schema": "https://json-schema.org/draft/2020-12/schema", **doc})

    messages = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "framerelay results API messages",
        "oneOf": [{"$ref": f"#/$defs/{m.__name__}"} for m in _MESSAGES],
        "discriminator": {"propertyName": "type"},
        "$defs": json.loads(json.dumps(_defs()).replace("#/components/schemas/", "#/$defs/")),
    }
    return {
        "result.schema.json": standalone(ResultRecord),
        "subscription.schema.json": standalone(Subscription),
        "sidecar.schema.json": standalone(SidecarLine),
        "messages.schema.json": _dump(messages),
        "asyncapi.json": _dump(asyncapi()),
    }


def breaking_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Fields removed or retyped between two AsyncAPI documents (same version = breaking)."""
    problems: list[str] = []
    old_defs = old.get("components", {}).get("schemas", {})
    new_defs = new.get("components", {}).get("schemas", {})
    for name, schema in old_defs.items():
        if name not in new_defs:
            problems.append(f"{name} was removed")
            continue
        old_props, new_props = schema.get("properties", {}), new_defs[name].get("properties", {})
        for prop, spec in old_props.items():
            if prop not in new_props:
                problems.append(f"{name}.{prop} was removed")
            elif not _compatible(_shape(spec), _shape(new_props[prop])):
                problems.append(f"{name}.{prop} changed type")
        added_required = set(new_defs[name].get("required", [])) - set(schema.get("required", []))
        problems += [f"{name}.{p} became required" for p in sorted(added_required)]
        if schema.get("additionalProperties") is not False and (
            new_defs[name].get("additionalProperties") is False
        ):
            problems.append(f"{name} now refuses unknown fields (its readers must ignore them)")
    return problems


def _shape(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: spec[k] for k in ("type", "$ref", "anyOf", "items", "enum", "const") if k in spec}


def _compatible(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Same shape, or an enum that only grew (a new error code is additive)."""
    if old == new:
        return True
    old_enum, new_enum = old.get("enum"), new.get("enum")
    if not (isinstance(old_enum, list) and isinstance(new_enum, list)):
        return False
    rest = {k: v for k, v in old.items() if k != "enum"}
    return rest == {k: v for k, v in new.items() if k != "enum"} and set(old_enum) <= set(new_enum)


def check(directory: Path = SCHEMA_DIR) -> list[str]:
    """Differences between the models and the checked-in documents (empty: in sync)."""
    problems = []
    rendered = render_all()
    for name, text in rendered.items():
        path = directory / name
        if not path.exists():
            problems.append(f"{path} is missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{path} differs from the models")
    doc_path = directory / "asyncapi.json"
    if doc_path.exists():
        old = json.loads(doc_path.read_text(encoding="utf-8"))
        if old.get("info", {}).get("version") == str(SCHEMA_VERSION):
            new = json.loads(rendered["asyncapi.json"])
            problems += [
                f"breaking change within v{SCHEMA_VERSION}: {p} (only additive changes are "
                "allowed; bump SCHEMA_VERSION)"
                for p in breaking_changes(old, new)
            ]
    return problems


def write(directory: Path = SCHEMA_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in render_all().items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m framerelay.schemas", description="Generate or check docs/schemas."
    )
    parser.add_argument("--dir", type=Path, default=SCHEMA_DIR)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate the documents")
    mode.add_argument("--check", action="store_true", help="exit 1 if they drifted")
    args = parser.parse_args(argv)
    if args.write:
        for path in write(args.dir):
            print(f"wrote {path}")
        return 0
    problems = check(args.dir)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print("regenerate with: python -m framerelay.schemas --write", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
