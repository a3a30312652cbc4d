"""``framerelay token mint``: a bearer token for an app, an operator or a service;
``framerelay token revoke``: refuse one token, or every token of a holder, at once.

The key set comes from ``--keys FILE`` or ``FRAMERELAY_SIGNING_KEYS_FILE``
(or ``FRAMERELAY_TOKEN_SECRETS`` on a single host). The token goes to stdout
and nowhere else. ``revoke`` appends ``jti:<id>`` or ``sub:<holder>`` to the
revocation file the services read (``FRAMERELAY_REVOKED_TOKENS_FILE``,
:mod:`framerelay.auth.revocation`); it never prints the token.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

HELP = "mint a token (e.g. for an app reading results)"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
REVOKED_ENV = "FRAMERELAY_REVOKED_TOKENS_FILE"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("token", help=HELP, description=HELP)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    mint = verbs.add_parser("mint", help="print a new token")
    scopes = "results:cam-1, results:*, streams:read, streams:write, routing:write, " \
        "fleet:read, fleet:write, jobs:read, jobs:write, metrics:read, worker:ID"  # fmt: skip
    mint.add_argument("--scope", action="append", required=True, help=f"repeatable: {scopes}")
    mint.add_argument("--aud", required=True, choices=["ingest", "orchestrator", "worker"],
                      help="the service that takes it")  # fmt: skip
    mint.add_argument("--ttl", default="1h", help="lifetime: 90s, 15m, 1h, 30d (default 1h)")
    mint.add_argument("--sub", default="app", help="who holds it (default 'app')")
    mint.add_argument(
        "--keys", type=Path, help="private key set (env FRAMERELAY_SIGNING_KEYS_FILE)"
    )
    mint.set_defaults(func=_mint)
    revoke = verbs.add_parser(
        "revoke",
        help="refuse a token (or every token of a holder) from now on",
        description="Append to the revocation file every service reads again within "
        "seconds; open sessions of a revoked token end.",
    )
    which = revoke.add_mutually_exclusive_group(required=True)
    which.add_argument("--token-file", type=Path, help="file holding the token to revoke")
    which.add_argument("--jti", help="the token's id (its jti claim)")
    which.add_argument("--sub", help="revoke every token of this holder (its sub claim)")
    revoke.add_argument(
        "--list",
        type=Path,
        default=os.environ.get(REVOKED_ENV) or None,
        help=f"the revocation file (env {REVOKED_ENV})",
    )
    revoke.set_defaults(func=_revoke)


def parse_ttl(text: str) -> float:
    from framerelay.errors import ConfigError

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if m is None:
        raise ConfigError(f"--ttl {text!r}: use a number with s, m, h or d (e.g. 15m, 1h)")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def _mint(args: argparse.Namespace) -> int:
    from framerelay.auth.config import load_keys
    from framerelay.auth.tokens import TokenIssuer
    from framerelay.errors import ConfigError
    from framerelay.settings import read_secret_file

    jwks = None
    if args.keys is not None:
        jwks = read_secret_file("--keys", str(args.keys))
    elif os.environ.get("FRAMERELAY_SIGNING_KEYS_FILE"):
        jwks = read_secret_file(
            "FRAMERELAY_SIGNING_KEYS_FILE", os.environ["FRAMERELAY_SIGNING_KEYS_FILE"]
        )
    else:
        jwks = os.environ.get("FRAMERELAY_SIGNING_KEYS")
    keys = load_keys(jwks, os.environ.get("FRAMERELAY_TOKEN_SECRETS"))
    if keys is None:
        raise ConfigError("no keys: give --keys FILE (from 'framerelay keys generate') or set "
                          "FRAMERELAY_SIGNING_KEYS_FILE")  # fmt: skip
    scopes = [s for arg in args.scope for s in arg.replace(",", " ").split()]
    token = TokenIssuer(keys).mint(args.sub, scopes, parse_ttl(args.ttl), aud=args.aud)
    sys.stdout.write(token + "\n")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from framerelay.auth.revocation import parse
    from framerelay.errors import ConfigError

    if args.list is None:
        raise ConfigError(f"no revocation file: give --list FILE or set {REVOKED_ENV}")
    entry = _entry(args)
    parse(entry, "the entry")  # the same rule the services read it with
    try:
        with args.list.open("a", encoding="utf-8") as fh:
            fh.write(entry + "\n")
    except OSError as exc:
        raise ConfigError(f"cannot append to {str(args.list)!r}: {exc.strerror}") from None
    sys.stdout.write(f"revoked {entry} (in {args.list})\n")
    return 0


def _entry(args: argparse.Namespace) -> str:
    """``jti:<id>`` or ``sub:<holder>``; a token file gives its own jti (read, not verified:
    revoking needs no key)."""
    import jwt

    from framerelay.errors import ConfigError
    from framerelay.settings import read_secret_file

    if args.jti is not None:
        return f"jti:{args.jti.strip()}"
    if args.sub is not None:
        return f"sub:{args.sub.strip()}"
    token = read_secret_file("--token-file", str(args.token_file)).strip()
    try:
        jti = jwt.decode(token, options={"verify_signature": False}).get("jti")
    except jwt.InvalidTokenError:
        raise ConfigError(f"{args.token_file}: not a token (a JWT)") from None
    if not isinstance(jti, str) or not jti:
        raise ConfigError(f"{args.token_file}: the token has no jti; revoke its holder (--sub)")
    return f"jti:{jti}"
