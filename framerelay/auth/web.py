"""FastAPI glue: a per-route scope dependency and 422s that echo nothing.

``dependencies=[auth.requires("streams:write")]`` on a route (or a router)
checks the bearer token before the route runs, so a refused request has no
effect; body validation (422) comes only after it passed.

Body size (:mod:`framerelay.web_limits`, outside every route): a request whose
``Content-Length`` is over the limit is a 413 before its token is checked (the
cheapest refusal, and nothing of it is read); a chunked body over the limit is
counted as the route reads it, so on an :class:`AuthFirstRoute` an
unauthenticated one is a 401 (never read) and an authenticated one a 413.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from framerelay.auth.guard import AuthGuard, Throttled, status_of
from framerelay.auth.tokens import Claims
from framerelay.errors import AuthError

SCOPE_ATTR = "framerelay_scope"
"""Set on every dependency made by :meth:`ApiAuth.requires` (route audits read it)."""


def peer_of(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


def http_error(exc: AuthError) -> HTTPException:
    """The HTTPException for a refusal: status, reason and the right headers."""
    code = status_of(exc)
    headers = {"WWW-Authenticate": 'Bearer realm="framerelay"'}
    if code == 401:
        headers["WWW-Authenticate"] += ', error="invalid_token"'
    elif code == 403:
        headers["WWW-Authenticate"] += ', error="insufficient_scope"'
    if isinstance(exc, Throttled):
        headers["Retry-After"] = str(max(1, round(exc.retry_after_s)))
    return HTTPException(code, str(exc), headers=headers)


class ApiAuth:
    """Builds route dependencies that demand one scope each."""

    def __init__(self, guard: AuthGuard) -> None:
        self.guard = guard

    def requires(self, scope: str) -> Any:
        """The dependency that demands ``scope``; ``{name}`` in it is the route's path
        parameter (``results:{stream_id}``: the stream the path names)."""
        templated = "{" in scope

        async def check(request: Request) -> Claims:
            wanted = scope.format_map(request.path_params) if templated else scope
            try:
                return self.guard.check(
                    request.headers.get("authorization"), wanted, peer_of(request)
                )
            except AuthError as exc:
                raise http_error(exc) from None

        setattr(check, SCOPE_ATTR, scope)
        return Depends(check)


class AuthFirstRoute(APIRoute):
    """A route that checks its token before FastAPI reads the body, so an unauthenticated
    request with a malformed body is a 401 too, never a 422 (the scope dependency then
    passes again). Use it as ``APIRouter(route_class=AuthFirstRoute)``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        calls = [d.call for d in self.dependant.dependencies if d.call is not None]
        checks = [c for c in calls if hasattr(c, SCOPE_ATTR)]
        if not checks:
            return handler

        async def checked(request: Request) -> Response:
            for check in checks:
                await check(request)  # raises the 401/403/429 HTTPException
            return await handler(request)

        return checked


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    """422 with where and why, but not the submitted values (passwords, URLs, keys)."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    detail = [
        {"type": e.get("type"), "loc": list(e.get("loc", ())), "msg": e.get("msg")} for e in errors
    ]
    return JSONResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


def install_validation_handler(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_error)


def route_scopes(app: FastAPI) -> dict[tuple[str, str], str | None]:
    """``(method or "WS", path) -> scope`` of every route (None: open)."""
    out: dict[tuple[str, str], str | None] = {}
    for route in _all_routes(app):
        path = getattr(route, "path", "")
        deps = getattr(getattr(route, "dependant", None), "dependencies", [])
        calls: list[Callable[..., Awaitable[Any]]] = [d.call for d in deps if d.call is not None]
        scope = next((getattr(c, SCOPE_ATTR) for c in calls if hasattr(c, SCOPE_ATTR)), None)
        for method in getattr(route, "methods", None) or {"WS"}:
            out[(method, path)] = scope
    return out


def _all_routes(app: FastAPI) -> list[Any]:
    """Every route, those of included routers too (newer FastAPI includes them lazily)."""
    try:
        from fastapi.routing import iter_route_contexts  # type: ignore[attr-defined,unused-ignore]
    except ImportError:  # older FastAPI: included routes are copied into app.routes
        return list(app.routes)
    return list(iter_route_contexts(app.routes))
