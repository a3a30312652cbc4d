"""The HTTP client of RunPod's REST API v2: requests, retries, problems, pages.

The API key travels only in the ``Authorization: Bearer`` header: never in a URL, a
log line, an exception or a metric (messages carry the method, the path and RunPod's
own problem text, never a request header).

* **Retries**: 429 (its ``Retry-After``, capped, with jitter), 5xx, timeouts and broken
  connections are :class:`Transient`; :meth:`RunPodHttp.call` retries them with
  exponential backoff and jitter. A create is sent once at a time through
  :meth:`RunPodHttp.send` instead: its caller looks the pod up before sending it again
  (:mod:`deploy.providers.runpod.provider`).
* **Problems**: v2 answers errors as RFC 9457 problems (``title``, ``status``,
  ``detail``, optional ``errors``, one string per invalid field);
  :func:`refusal` turns one into a one-line :class:`ProviderError` that says what to
  change (the key, the balance, the key's access, a field this version refuses).
* **Pages**: lists come wrapped (``{"pods": [...]}``); :meth:`RunPodHttp.pages`
  follows ``pagination.nextCursor`` while ``hasNextPage`` says there is more (an answer
  without ``pagination`` is the only page).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from deploy.providers.base import ProviderError
from deploy.settings import RunPodSettings
from framerelay.backoff import Backoff

Found = TypeVar("Found")
"""What a create's lookup by name finds (a pod, an endpoint)."""
log = logging.getLogger(__name__)
_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_MAX_RETRY_AFTER_S = 30.0
_MAX_PAGES = 1000
_LINE = 300
_SPACE = re.compile(r"\s+")
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
"""Transport errors before the request left: nothing can have happened at RunPod."""
_WHAT_TO_DO = {
    401: "RunPod refused the API key: set a valid one in FRAMERELAY_ORCH_RUNPOD__API_KEY "
    "(or ..._API_KEY_FILE)",
    402: "the RunPod account's balance is too low: add funds, then it is tried again",
    403: "the API key may not do this: give it read and write access to pods (and read "
    "access to the catalog and network volumes)",
    422: "RunPod's API v2 refuses what framerelay sent (a field or value it does not "
    "take): report this line",
}


def one_line(text: str, most: int = _LINE) -> str:
    """``text`` on one line, at most ``most`` characters."""
    flat = _SPACE.sub(" ", text).strip()
    return flat if len(flat) <= most else flat[: most - 3] + "..."


@dataclass(frozen=True, slots=True)
class Problem:
    """An RFC 9457 problem as RunPod answers it."""

    status: int
    title: str
    detail: str
    errors: tuple[str, ...] = ()

    @classmethod
    def of(cls, resp: httpx.Response) -> Problem:
        """The response's problem; its plain text when it is not one."""
        try:
            body = resp.json()
        except ValueError:
            return cls(resp.status_code, resp.reason_phrase, one_line(resp.text))
        if not isinstance(body, dict):
            return cls(resp.status_code, resp.reason_phrase, one_line(str(body)))
        errors = body.get("errors")
        return cls(
            status=resp.status_code,
            title=str(body.get("title") or resp.reason_phrase),
            detail=str(body.get("detail") or body.get("message") or body.get("error") or ""),
            errors=tuple(str(e) for e in errors) if isinstance(errors, list) else (),
        )

    def line(self) -> str:
        """``HTTP 422 Unprocessable Entity: Request validation failed. ($: ...)``."""
        text = f"HTTP {self.status} {self.title}"
        if self.detail:
            text += f": {self.detail}"
        if self.errors:
            text += f" ({'; '.join(self.errors)})"
        return one_line(text)


class Transient(Exception):
    """A request that may succeed if sent again: 429, 5xx, a timeout, a broken
    connection. ``maybe_done``: RunPod may have acted on it (a 5xx or a lost answer),
    unlike a 429 or a connection that never opened."""

    def __init__(self, message: str, *, maybe_done: bool, retry_after: float | None = None):
        super().__init__(message)
        self.maybe_done = maybe_done
        self.retry_after = retry_after


def refusal(resp: httpx.Response, what: str) -> ProviderError:
    """The one-line error for a 4xx/5xx answer to ``what`` ("create pod fr-x-0-g0")."""
    line = Problem.of(resp).line()
    todo = _WHAT_TO_DO.get(resp.status_code)
    return ProviderError(f"RunPod could not {what}: {line}" + (f": {todo}" if todo else ""))


def check(resp: httpx.Response, what: str) -> None:
    """Raise :func:`refusal` for an error answer."""
    if resp.status_code >= 400:
        raise refusal(resp, what)


def json_body(resp: httpx.Response, what: str) -> Any:
    """The answer's JSON; a clear error when it has none (not RunPod's API?)."""
    try:
        return resp.json()
    except ValueError:
        raise ProviderError(
            f"RunPod answered {what} (HTTP {resp.status_code}) with no JSON: is "
            "FRAMERELAY_ORCH_RUNPOD__BASE_URL RunPod's REST API v2?"
        ) from None


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class RunPodHttp:
    """One connection pool to RunPod, with the key in its default headers."""

    def __init__(
        self, settings: RunPodSettings, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        key = settings.api_key.get_secret_value() if settings.api_key is not None else ""
        self.settings = settings
        self._client = httpx.AsyncClient(
            base_url=settings.base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {key}"},
            timeout=settings.timeout_s,
            transport=transport,
        )
        self.retries = 0
        """Requests sent again after a transient failure (429, 5xx, timeouts)."""

    def backoff(self) -> Backoff:
        first = min(self.settings.backoff_s, _MAX_RETRY_AFTER_S)
        return Backoff(first, _MAX_RETRY_AFTER_S, jitter=0.2)

    async def pause(self, backoff: Backoff, exc: Transient, what: str) -> None:
        """Wait before sending ``what`` again: the backoff, or RunPod's Retry-After."""
        wait = backoff.next_delay()
        if exc.retry_after is not None:  # the server's word, capped, with our jitter
            wait = backoff.jittered(min(exc.retry_after, _MAX_RETRY_AFTER_S))
        log.warning("RunPod %s: %s; again in %.2f s", what, exc, wait)
        self.retries += 1
        await asyncio.sleep(wait)

    async def send(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """One request; :class:`Transient` for what may succeed if sent again."""
        try:
            resp = await self._client.request(method, path, json=body, params=params)
        except httpx.TransportError as exc:
            raise Transient(type(exc).__name__, maybe_done=not isinstance(exc, _NOT_SENT)) from None
        if resp.status_code in _RETRY_STATUS:
            raise Transient(
                Problem.of(resp).line(),
                maybe_done=resp.status_code != 429,
                retry_after=_seconds(resp.headers.get("Retry-After")),
            )
        return resp

    async def create_once(
        self,
        path: str,
        body: Mapping[str, Any],
        what: str,
        find: Callable[[], Awaitable[Found | None]],
    ) -> httpx.Response | Found:
        """``POST path`` so that at most one thing is ever made: after a failure whose
        answer may be lost (a 5xx, a timeout), ``find()`` looks the thing up by its unique
        name and takes it before another POST is sent. The response (for the caller to
        read), or what ``find`` found; :class:`ProviderError` once the retries are spent.
        ``what`` names it in messages (``pod fr-x-0-g0``)."""
        backoff = self.backoff()
        for attempt in range(self.settings.max_retries + 1):
            try:
                return await self.send("POST", path, body=body)
            except Transient as exc:
                found = await find() if exc.maybe_done else None
                if found is not None:
                    log.warning(
                        "create %s: %s, yet RunPod has it: taken, not created again", what, exc
                    )
                    return found
                if attempt == self.settings.max_retries:
                    raise ProviderError(
                        f"RunPod could not create {what}: {exc} ({attempt + 1} attempts; none "
                        "of that name exists)"
                    ) from None
                await self.pause(backoff, exc, f"create {what}")
        raise AssertionError("unreachable")  # pragma: no cover

    async def call(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """The request, sent again after transient failures (``max_retries`` times); a
        :class:`ProviderError` once they are spent. Only for requests that may be
        repeated (reads, lifecycle actions): never a create."""
        backoff = self.backoff()
        for attempt in range(self.settings.max_retries + 1):
            try:
                return await self.send(method, path, body=body, params=params)
            except Transient as exc:
                if attempt == self.settings.max_retries:
                    raise ProviderError(
                        f"RunPod {method} {path} failed after {attempt + 1} attempts: {exc}"
                    ) from None
                await self.pause(backoff, exc, f"{method} {path}")
        raise AssertionError("unreachable")  # pragma: no cover

    async def pages(
        self, path: str, key: str, what: str, params: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """Every item of a wrapped list (``{key: [...]}``), page after page."""
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        seen: set[str] = set()
        for _ in range(_MAX_PAGES):
            query = {**(params or {}), **({"cursor": cursor} if cursor else {})}
            resp = await self.call("GET", path, params=query or None)
            check(resp, what)
            body = json_body(resp, f"GET {path}")
            if not isinstance(body, dict) or not isinstance(body.get(key), list):
                raise ProviderError(
                    f"RunPod answered GET {path} without its {key!r} list: is "
                    "FRAMERELAY_ORCH_RUNPOD__BASE_URL RunPod's REST API v2?"
                )
            items += [item for item in body[key] if isinstance(item, dict)]
            cursor = _next_cursor(body.get("pagination"))
            if cursor is None:
                return items
            if cursor in seen:
                raise ProviderError(f"RunPod's pages of GET {path} repeat a cursor; stopped")
            seen.add(cursor)
        raise ProviderError(f"RunPod's GET {path} has more than {_MAX_PAGES} pages; stopped")

    async def aclose(self) -> None:
        await self._client.aclose()


def _next_cursor(pagination: object) -> str | None:
    """The next page's cursor, when the page says there is one."""
    if not isinstance(pagination, dict) or pagination.get("hasNextPage") is not True:
        return None
    cursor = pagination.get("nextCursor")
    return cursor if isinstance(cursor, str) and cursor else None
