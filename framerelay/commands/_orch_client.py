"""Shared by ``pods``, ``streams`` and ``fleet``: talk to the orchestrator API.

Every call sends ``Authorization: Bearer <token>``: the token in
``--token-file`` or ``FRAMERELAY_TOKEN``, or, where this machine holds the
keys (``FRAMERELAY_SIGNING_KEYS[_FILE]``, or ``FRAMERELAY_TOKEN_SECRETS`` on a
single host), a 5-minute one minted here (aud orchestrator,
``fleet:read fleet:write jobs:read jobs:write``). ``https://`` is verified with ``--ca`` /
``FRAMERELAY_ORCH_CA_FILE`` (or the system's CAs).
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from framerelay.errors import ConfigError
from framerelay.net import plain_http_problem

DEFAULT_URL = "http://127.0.0.1:8090"
TOKEN_ENV = "FRAMERELAY_TOKEN"  # noqa: S105 - a variable name
CA_ENV = "FRAMERELAY_ORCH_CA_FILE"
LOCAL_TOKEN_TTL_S = 300.0
SCOPES = ("fleet:read", "fleet:write", "jobs:read", "jobs:write")
_HOW = (
    "give a token with FRAMERELAY_TOKEN or --token-file (framerelay token mint --aud "
    "orchestrator --scope fleet:read --scope fleet:write), or set FRAMERELAY_SIGNING_KEYS_FILE "
    "to mint one here"
)


def add_url(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=os.environ.get("FRAMERELAY_ORCH_URL", DEFAULT_URL),
        help=f"orchestrator API (env FRAMERELAY_ORCH_URL; default {DEFAULT_URL})",
    )
    p.add_argument("--token-file", type=Path, help=f"file holding a bearer token (env {TOKEN_ENV})")
    p.add_argument("--ca", type=Path, default=os.environ.get(CA_ENV) or None,
                   help=f"CA file to verify an https orchestrator (env {CA_ENV})")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print raw JSON")


def _signing_keys() -> str | None:
    from framerelay.settings import read_secret_file

    path = os.environ.get("FRAMERELAY_SIGNING_KEYS_FILE")
    if path:
        return read_secret_file("FRAMERELAY_SIGNING_KEYS_FILE", path)
    return os.environ.get("FRAMERELAY_SIGNING_KEYS")


def token(args: argparse.Namespace) -> str | None:
    """The bearer token to send (None: none available; the API will say 401)."""
    from framerelay.settings import read_secret_file

    if getattr(args, "token_file", None) is not None:
        return read_secret_file("--token-file", str(args.token_file)).strip()
    if os.environ.get(TOKEN_ENV, "").strip():
        return os.environ[TOKEN_ENV].strip()
    from framerelay.auth.config import load_keys
    from framerelay.auth.tokens import TokenIssuer

    keys = load_keys(_signing_keys(), os.environ.get("FRAMERELAY_TOKEN_SECRETS"))
    if keys is None:
        return None
    return TokenIssuer(keys).mint("cli", SCOPES, LOCAL_TOKEN_TTL_S, aud="orchestrator")


def _verify(args: argparse.Namespace) -> ssl.SSLContext | bool:
    ca = getattr(args, "ca", None)
    if ca is None:
        return True
    try:
        return ssl.create_default_context(cafile=str(ca))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the CA file {str(ca)!r} (--ca / {CA_ENV}): {exc}") from None


def _unreachable(args: argparse.Namespace, exc: Exception) -> ConfigError:
    cause: BaseException | None = exc
    for _ in range(6):
        if isinstance(cause, ssl.SSLCertVerificationError):
            return ConfigError(
                f"TLS verification of {args.url} failed ({cause.verify_message}); give the "
                f"orchestrator's CA with --ca or {CA_ENV}"
            )
        cause = None if cause is None else (cause.__cause__ or cause.__context__)
    return ConfigError(
        f"cannot reach the orchestrator at {args.url} ({type(exc).__name__}); "
        "is `framerelay orchestrator` running? (--url / FRAMERELAY_ORCH_URL)"
    )


def _refusal(status: int, detail: object, sent: bool) -> ConfigError:
    if status == 403:
        return ConfigError(f"orchestrator refused (HTTP 403): {detail}; use a token with "
                           "fleet:read (reads) or fleet:write (changes); for jobs, jobs:read "
                           "or jobs:write")  # fmt: skip
    if status == 429:
        return ConfigError(f"orchestrator refused (HTTP 429): {detail}")
    what = "the token was refused" if sent else "no token"
    return ConfigError(f"orchestrator refused (HTTP 401, {what}): {detail}; {_HOW}")


def call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    import httpx

    problem = plain_http_problem(args.url, "the orchestrator")
    if problem is not None:
        raise ConfigError(f"{problem} (--url / FRAMERELAY_ORCH_URL; verify it with --ca)")
    bearer = token(args)
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    url = args.url.rstrip("/") + path
    try:
        resp = httpx.request(
            method, url, json=body, headers=headers, timeout=15, verify=_verify(args)
        )
    except httpx.HTTPError as exc:
        raise _unreachable(args, exc) from None
    if resp.status_code >= 400:
        try:
            detail = resp.json().get("detail", resp.text)
        except ValueError:
            detail = resp.text
        if resp.status_code in (401, 403, 429):
            raise _refusal(resp.status_code, detail, bearer is not None)
        if resp.status_code == 422 and isinstance(detail, list):
            detail = invalid(detail)
        raise ConfigError(f"orchestrator said HTTP {resp.status_code}: {detail}")
    return resp.json()


def invalid(detail: list[Any]) -> str:
    """A 422's errors as ``where: why; ...`` (``inputs.2: no such file ...``)."""
    said = []
    for e in detail[:10]:
        loc = e.get("loc", []) if isinstance(e, dict) else []
        where = ".".join(str(p) for p in loc if p != "body") or "body"
        said.append(f"{where}: {e.get('msg') if isinstance(e, dict) else e}")
    return "; ".join(said)


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    cells = [[str(c) for c in header], *[["" if c is None else str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def emit(args: argparse.Namespace, data: Any, text: str) -> int:
    print(json.dumps(data, indent=2) if args.json else text)
    return 0
