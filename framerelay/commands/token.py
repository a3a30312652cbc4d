"""``framerelay token mint``: a bearer token for an app, an operator or a service.

The key set comes from ``--keys FILE`` or ``FRAMERELAY_SIGNING_KEYS_FILE``
(or ``FRAMERELAY_TOKEN_SECRETS`` on a single host). The token goes to stdout
and nowhere else.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

HELP = "mint a token (e.g. for an app reading results)"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


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
