"""``framerelay ca init|issue``: the certificate authority of a deployment.

The orchestrator runs the same CA (``FRAMERELAY_ORCH_CA_DIR``) and gives
every pod it creates a certificate of its own; ``ca issue`` makes the
certificates of the services you run yourself (the ingest API, the
orchestrator API, a worker on a host of yours). Everything that connects to
them verifies against ``ca.pem``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "create the deployment's CA and issue service certificates"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("ca", help=HELP, description=HELP)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    init = verbs.add_parser("init", help="create the CA (ca.pem, ca.key 0600) unless it exists")
    init.add_argument("--dir", type=Path, required=True, help="CA folder (created 0700)")
    init.set_defaults(func=_init)
    issue = verbs.add_parser("issue", help="issue a server certificate signed by the CA")
    issue.add_argument("--dir", type=Path, required=True, help="CA folder")
    issue.add_argument("--name", required=True, help="the DNS name clients connect to")
    issue.add_argument("--dns", action="append", default=[], help="more DNS names (repeatable)")
    issue.add_argument("--ip", action="append", default=[], help="IP addresses (repeatable)")
    issue.add_argument("--ttl", default="90d", help="lifetime: 12h, 30d, 90d (default, at most)")
    issue.add_argument("--out", type=Path, required=True,
                       help="writes OUT.pem (certificate) and OUT.key (key, 0600)")  # fmt: skip
    issue.set_defaults(func=_issue)


def _init(args: argparse.Namespace) -> int:
    from deploy.ca import CA_CERT, PodCA

    existed = (args.dir / CA_CERT).exists()
    PodCA.load_or_create(args.dir)
    verb = "uses the existing" if existed else "created a new"
    print(f"{args.dir}: {verb} CA; clients verify with {args.dir / CA_CERT}", file=sys.stderr)
    return 0


def _issue(args: argparse.Namespace) -> int:
    from deploy.ca import CA_CERT, PodCA
    from framerelay.commands.keys import write_private
    from framerelay.commands.token import parse_ttl
    from framerelay.errors import ConfigError

    if not (args.dir / CA_CERT).exists():
        raise ConfigError(f"no CA in {args.dir}; run 'framerelay ca init --dir {args.dir}' first")
    ca = PodCA.load_or_create(args.dir)
    cert, key = ca.issue(args.name, [args.name, *args.dns], args.ip, parse_ttl(args.ttl))
    cert_path, key_path = Path(f"{args.out}.pem"), Path(f"{args.out}.key")
    write_private(key_path, key, exist_ok=True)
    cert_path.write_text(cert, encoding="utf-8")
    print(f"wrote {cert_path} and {key_path} for {args.name}", file=sys.stderr)
    return 0
