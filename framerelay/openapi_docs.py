"""The OpenAPI document of a service and its pages, Swagger UI and ReDoc, served offline.

:func:`install_docs` adds to a FastAPI app (built with ``openapi_url=None,
docs_url=None, redoc_url=None``):

* ``GET /openapi.json`` - the document, completed from the routes: the HTTP
  bearer (JWT) security scheme, each route's scope as its security
  requirement (an empty one for open routes), the refusals every scoped route
  can answer (401, 403, 429), 413 for request bodies, and every error with
  the body it really has (:class:`ErrorBody`, :class:`ValidationErrorBody`);
* ``GET /docs`` (Swagger UI) and ``GET /redoc`` (ReDoc), whose scripts and
  styles are the files in :mod:`framerelay.openapi_assets`, served at
  ``/docs/assets/<name>``: no CDN, nothing fetched from another host.

All four are open: they describe the API and hold no data; every operation
they list still needs its token. Routes declare their own errors with
:func:`errors` (404, 409, 503, ...).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from fastapi import FastAPI, HTTPException, Response
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field

from framerelay.auth.web import route_scopes

SCHEME = "bearerAuth"
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
}
ASSET_PREFIX = "/docs/assets/"
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-inline'; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; "
    "worker-src 'self' blob:; connect-src 'self'; frame-ancestors 'none'",
}
"""The pages load nothing from another origin (ReDoc's menu links a logo on a CDN: the
browser never requests it)."""
HTTP_METHODS = ("get", "put", "post", "delete", "patch")
REFUSALS = {
    401: "No token, or one that is malformed, badly signed, expired, not yet valid or "
    "for another service (`WWW-Authenticate: Bearer`)",
    403: "The token does not grant this route's scope",
    429: "Too many failed authentications from this address (`Retry-After`)",
}
DESCRIPTIONS = {
    400: "Bad request",
    404: "Not found",
    409: "Conflict with the current state",
    413: "Request body over the service's limit (`max_body_bytes`)",
    422: "Invalid input: where and why, never the submitted values",
    503: "Not available now",
}


class ErrorBody(BaseModel):
    """What every refusal and error answers (FastAPI's ``HTTPException`` shape)."""

    detail: str = Field(description="One line: what is wrong and, where it helps, what to do.")


class ValidationIssue(BaseModel):
    type: str = Field(description="The pydantic error type, e.g. missing, extra_forbidden.")
    loc: list[str | int] = Field(description="Where: body, query or path, then the field.")
    msg: str = Field(description="Why (never the submitted value).")


class ValidationErrorBody(BaseModel):
    """A 422: every problem found, without echoing the submitted values."""

    detail: list[ValidationIssue]


def errors(*codes: int, **described: str) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: each code with :class:`ErrorBody`; ``described`` maps
    ``"e404"``-style keys to a description for this route."""
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        text = described.get(f"e{code}", DESCRIPTIONS.get(code, "Error"))
        out[code] = {"model": ErrorBody, "description": text}
    return out


def install_docs(
    app: FastAPI,
    security: str,
    extra_paths: Mapping[str, dict[str, Any]] | None = None,
    models: Sequence[type[BaseModel]] = (),
) -> None:
    """Serve the completed OpenAPI document, ``/docs`` and ``/redoc`` (see the module).
    ``security``: the bearer scheme's description (audience, scopes); ``extra_paths``:
    path items FastAPI cannot describe (a WebSocket's upgrade request), whose schemas
    ``models`` adds to the components."""
    cached: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        if not cached:
            cached.update(complete(app, security, extra_paths or {}, models))
        return cached

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/openapi.json", include_in_schema=False)
    async def document() -> Response:
        return Response(json.dumps(openapi()), media_type="application/json")

    @app.get("/docs", include_in_schema=False)
    async def swagger() -> HTMLResponse:
        return HTMLResponse(_swagger_page(app.title), headers=PAGE_HEADERS)

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return HTMLResponse(_redoc_page(app.title), headers=PAGE_HEADERS)

    @app.get(ASSET_PREFIX + "{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in ASSETS:
            raise HTTPException(404, f"no asset {name!r}")
        body = resources.files("framerelay.openapi_assets").joinpath(name).read_bytes()
        headers = {"Cache-Control": "public, max-age=86400"}
        return Response(body, media_type=ASSETS[name], headers=headers)


def complete(
    app: FastAPI,
    security: str,
    extra_paths: Mapping[str, dict[str, Any]],
    models: Sequence[type[BaseModel]] = (),
) -> dict[str, Any]:
    """FastAPI's document plus security, refusals, 413s and the real error bodies."""
    spec = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    spec.setdefault("paths", {}).update(extra_paths)
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    own: list[type[BaseModel]] = [ErrorBody, ValidationIssue, ValidationErrorBody]
    for model in [*own, *models]:
        schema = model.model_json_schema(ref_template=REF + "{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    spec["components"]["securitySchemes"] = {
        SCHEME: {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "JWT",
            "description": security,
        }
    }
    scopes = route_scopes(app)
    for path, item in spec["paths"].items():
        for method in HTTP_METHODS:
            if method in item:
                op, key = item[method], (method.upper(), path)
                if key in scopes:  # a real route (extra paths state their own security)
                    _secure(op, scopes[key])
                _complete_errors(op)
    return spec


REF = "#/components/schemas/"


def _secure(op: dict[str, Any], scope: str | None) -> None:
    op["security"] = [{SCHEME: [scope]}] if scope is not None else []  # []: open
    if scope is not None:
        for code, text in REFUSALS.items():
            op.setdefault("responses", {}).setdefault(str(code), _error(text))


def _complete_errors(op: dict[str, Any]) -> None:
    responses = op.setdefault("responses", {})
    if "requestBody" in op:
        responses.setdefault("413", _error(DESCRIPTIONS[413]))
    if "422" in responses:
        responses["422"] = _error(DESCRIPTIONS[422], "ValidationErrorBody")


def _error(description: str, model: str = "ErrorBody") -> dict[str, Any]:
    schema = {"$ref": REF + model}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_SWAGGER = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title} - API</title>
<link rel="stylesheet" href="{prefix}swagger-ui.css"></head>
<body><div id="swagger-ui"></div>
<script src="{prefix}swagger-ui-bundle.js"></script>
<script>
window.ui = SwaggerUIBundle({{url: "/openapi.json", dom_id: "#swagger-ui",
  validatorUrl: null, deepLinking: true, persistAuthorization: false}});
</script></body></html>
"""

_REDOC = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title} - API</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body {{ margin: 0; padding: 0; }}</style></head>
<body><redoc spec-url="/openapi.json" hide-download-button="false"></redoc>
<script src="{prefix}redoc.standalone.js"></script></body></html>
"""


def _swagger_page(title: str) -> str:
    return _SWAGGER.format(title=title, prefix=ASSET_PREFIX)


def _redoc_page(title: str) -> str:
    return _REDOC.format(title=title, prefix=ASSET_PREFIX)
