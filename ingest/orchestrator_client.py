"""The ingest's read-only client of the orchestrator API (:data:`SCOPES`), over HTTP only.

Used by the console's fleet and jobs panels (:mod:`ingest.console_fleet`,
:mod:`ingest.console_jobs`). Configured by ``FRAMERELAY_INGEST_ORCHESTRATOR_URL``
(``https://``; plain ``http://`` only to this host), ``..._ORCHESTRATOR_TOKEN`` (a
token for audience ``orchestrator`` granting ``fleet:read`` and ``jobs:read``; one
without ``jobs:read`` leaves the jobs panel with the orchestrator's 403) or, without
one, tokens minted here for :data:`TOKEN_TTL_S` with the ingest's private signing
keys (both scopes), and
``..._ORCHESTRATOR_CA`` (verifies an ``https://`` orchestrator; default: the
system's CAs).

Every call has short timeouts, reads at most :data:`MAX_BODY_BYTES`, and fails
with an :class:`OrchestratorError` whose one-line message says why (unreachable,
timed out, TLS, the orchestrator's own reason for a 401/403) and never holds
the token.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from framerelay.auth import TokenIssuer
from framerelay.errors import ConfigError, FramerelayError
from framerelay.net import describe_http_error, verify_context
from ingest.auth import ingest_keys
from ingest.settings import ORCHESTRATOR_TOKEN_ENV, IngestSettings

TIMEOUT = httpx.Timeout(2.0)
"""Per request: 2 s to connect, and for each read, write and pool wait
(FRAMERELAY_INGEST_ORCHESTRATOR_TIMEOUT_S)."""
MAX_BODY_BYTES = 4 << 20
"""An answer larger than this is refused (the fleet of a big deployment is ~100 KB)."""
TOKEN_TTL_S = 300.0
RENEW_BEFORE_S = 60.0
SCOPE = "fleet:read"
SCOPES = (SCOPE, "jobs:read")
"""What a minted token grants: the fleet panel's reads and the jobs panel's."""
DETAIL_CHARS = 200
Request = tuple[str, Mapping[str, str]]
"""``(path, query parameters)``."""


class OrchestratorError(FramerelayError):
    """The orchestrator gave no usable answer; the message says why in one line."""


def orchestrator_tokens(settings: IngestSettings) -> Callable[[], str]:
    """``token()``: the configured token, or one minted with the signing keys (renewed
    :data:`RENEW_BEFORE_S` before it expires). ConfigError without a way to get one."""
    if settings.orchestrator_token is not None:
        fixed = settings.orchestrator_token.get_secret_value()
        return lambda: fixed
    keys = ingest_keys(settings)
    try:
        issuer = TokenIssuer(keys) if keys is not None else None
    except ConfigError:  # a public key set verifies, never signs
        issuer = None
    if issuer is None:
        raise ConfigError(
            f"FRAMERELAY_INGEST_ORCHESTRATOR_URL needs {ORCHESTRATOR_TOKEN_ENV} (audience "
            "orchestrator, scopes fleet:read and jobs:read) or a private "
            "FRAMERELAY_SIGNING_KEYS_FILE to mint one"
        )
    return _MintedToken(issuer)


class _MintedToken:
    """A token granting :data:`SCOPES` minted with the ingest's keys, renewed before it
    expires."""

    def __init__(self, issuer: TokenIssuer) -> None:
        self._issuer = issuer
        self._token = ""
        self._renew_at = 0.0

    def __call__(self) -> str:
        now = time.time()
        if now >= self._renew_at:
            self._token = self._issuer.mint("ingest", list(SCOPES), TOKEN_TTL_S, aud="orchestrator")
            self._renew_at = now + TOKEN_TTL_S - RENEW_BEFORE_S
        return self._token


class OrchestratorClient:
    """GETs JSON from the orchestrator API (see the module)."""

    def __init__(
        self,
        url: str,
        token: Callable[[], str],
        *,
        verify: ssl.SSLContext | bool = True,
        timeout: httpx.Timeout = TIMEOUT,
    ) -> None:
        self.url = url.rstrip("/")
        self._token = token
        self._verify = verify
        self._timeout = timeout
        self.deadline_s = 2 * (timeout.read or 2.0)
        """What a whole refresh of a panel may take (all its requests): twice a read."""

    @classmethod
    def from_settings(cls, settings: IngestSettings) -> OrchestratorClient | None:
        """The client the settings describe; None without an orchestrator URL; ConfigError
        without credentials or with a CA file that cannot be loaded."""
        url = settings.orchestrator_url
        if url is None:
            return None
        ca = settings.orchestrator_ca
        verify = verify_context(ca, "the orchestrator (FRAMERELAY_INGEST_ORCHESTRATOR_CA)")
        timeout = httpx.Timeout(settings.orchestrator_timeout_s)
        return cls(url, orchestrator_tokens(settings), verify=verify, timeout=timeout)

    async def get_all(self, requests: Sequence[Request]) -> list[Any]:
        """The JSON answers to ``requests``, in order, over one connection (a fresh client
        per call: nothing outlives it). OrchestratorError at the first that fails."""
        token = self._token()
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        async with httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=self._timeout, verify=self._verify,
            follow_redirects=False, trust_env=False,
        ) as http:  # fmt: skip
            return [await self._get(http, path, params, token) for path, params in requests]

    async def _get(
        self, http: httpx.AsyncClient, path: str, params: Mapping[str, str], token: str
    ) -> Any:
        try:
            async with http.stream("GET", path, params=params) as resp:
                body = await _read_capped(resp, path)
        except httpx.TimeoutException:
            raise OrchestratorError(
                f"the orchestrator did not answer GET {path} in time (timeout)"
            ) from None
        except httpx.HTTPError as exc:
            raise OrchestratorError(
                f"the orchestrator is unreachable: {describe_http_error(exc)}"
            ) from None
        if resp.status_code in (401, 403):
            raise OrchestratorError(_refusal(resp.status_code, _detail(body, token), path))
        if resp.status_code != 200:
            raise OrchestratorError(
                f"the orchestrator answered GET {path} with HTTP {resp.status_code}: "
                f"{_detail(body, token)}"
            )
        try:
            return json.loads(body)
        except ValueError:
            raise OrchestratorError(
                f"the orchestrator's answer to GET {path} is not JSON"
            ) from None


async def _read_capped(resp: httpx.Response, path: str) -> bytes:
    """The body, refused past :data:`MAX_BODY_BYTES` (never buffered beyond it)."""
    chunks, size = [], 0
    async for chunk in resp.aiter_bytes():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise OrchestratorError(
                f"the orchestrator's answer to GET {path} is larger than {MAX_BODY_BYTES} bytes"
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _refusal(status: int, detail: str, path: str) -> str:
    scope = "jobs:read" if path.startswith("/v1/jobs") else SCOPE  # what GET ``path`` needs
    fix = (
        f"check {ORCHESTRATOR_TOKEN_ENV} (audience orchestrator, scope {scope}) or that the "
        "orchestrator trusts the ingest's signing keys"
        if status == 401
        else f"the ingest's token lacks {scope}"
    )
    return f"the orchestrator refused the ingest's token (HTTP {status}: {detail}); {fix}"


def _detail(body: bytes, token: str) -> str:
    """The orchestrator's ``detail`` as one printable line, at most :data:`DETAIL_CHARS`, with
    the token (should it ever be echoed) masked."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = body.decode("utf-8", "replace")
    detail = parsed.get("detail", parsed) if isinstance(parsed, dict) else parsed
    line = " ".join(str(detail).split())
    if token:
        line = line.replace(token, "***")
    return "".join(c for c in line if c.isprintable())[:DETAIL_CHARS] or "no reason given"
