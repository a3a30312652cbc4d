"""What the ingest API's OpenAPI document says beyond its routes: the security
scheme's scopes and the results WebSocket (:mod:`ingest.hub`).

OpenAPI has no WebSocket operations: ``GET /v1/results`` is documented as the
upgrade request it is, with its query parameters, the ``101`` that opens the
socket and the refusals answered before it (with an
:class:`~framerelay.schemas.ErrorMessage` body). The messages then sent are in
``docs/schemas`` (JSON Schema and AsyncAPI).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from framerelay.openapi_docs import REF, SCHEME
from framerelay.schemas import ErrorMessage, ResultMessage, SubscribedMessage

SECURITY = (
    "A JWT for audience `framerelay-ingest` (`framerelay token mint --aud ingest`). Scopes: "
    "`streams:read` (list and show streams, tunnels, routing), `streams:write` (add, replace, "
    "remove streams), `routing:write` (the orchestrator: place streams on workers), "
    "`results:<stream id>` or `results:*` (the results WebSocket), `metrics:read` (`/metrics`, "
    "only with `FRAMERELAY_INGEST_METRICS_AUTH=true`)."
)
MODELS: tuple[type[BaseModel], ...] = (ErrorMessage, SubscribedMessage, ResultMessage)
_REFUSED = {
    "400": "Bad subscription (unknown or invalid query parameter)",
    "401": "No token, or an invalid, expired or foreign one (`WWW-Authenticate: Bearer`)",
    "403": "The token does not grant `results:<id>` for every stream asked for",
    "429": "Too many failed authentications from this address (`Retry-After`)",
    "503": "Too many subscribers (`max_subscribers`)",
}


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description,
            "schema": schema}  # fmt: skip


RESULTS_WEBSOCKET: dict[str, Any] = {
    "get": {
        "tags": ["results"],
        "summary": "Results WebSocket (upgrade)",
        "description": (
            "Open with a WebSocket upgrade (`ws://` or `wss://`) and "
            "`Authorization: Bearer <token>` granting `results:<id>` for each stream "
            "(`results:*` for all). The hub sends `subscribed`, replayed results "
            "(`resume`), then live `result` messages (`ResultMessage`), `notice`s while "
            "results are dropped for a slow subscriber, and an `error` before it closes "
            "(4401 token expired, 4408 too slow). Refusals come before the upgrade."
        ),
        "operationId": "results_websocket",
        "parameters": [
            _query(
                "stream",
                "Stream to receive (repeatable); none: every stream (needs `results:*`)",
                {"type": "array", "items": {"type": "string"}},
            ),
            _query(
                "class",
                "Only detections of these class names (repeatable or comma-separated)",
                {"type": "array", "items": {"type": "string"}},
            ),
            _query(
                "min_confidence",
                "Only detections at or above this confidence",
                {"type": "number", "minimum": 0, "maximum": 1},
            ),
            _query(
                "resume",
                "`<stream>@<durable id>`: replay the results after it first (repeatable)",
                {"type": "array", "items": {"type": "string"}},
            ),
        ],
        "security": [{SCHEME: ["results:<stream id>"]}],
        "responses": {
            "101": {
                "description": "Switching protocols: the subscription is open; the first "
                "message is `SubscribedMessage`, then `ResultMessage`s",
                "content": {"application/json": {"schema": {"$ref": REF + "ResultMessage"}}},
            },
            **{
                code: {
                    "description": text,
                    "content": {"application/json": {"schema": {"$ref": REF + "ErrorMessage"}}},
                }
                for code, text in _REFUSED.items()
            },
        },
    }
}
"""The ``/v1/results`` path item."""
