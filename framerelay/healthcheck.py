"""Container health checks that work with TLS on or off: ``python -m framerelay.healthcheck``.

    python -m framerelay.healthcheck PORT [PATH] [--ca FILE] [--cert FILE --key FILE]

Asks ``https://127.0.0.1:PORT/PATH`` first, then ``http://`` (a service
serves one or the other), and exits 0 on a 2xx answer, 1 otherwise with one
line on stderr. Over https the server's certificate is checked against
``--ca`` (the pod CA) when given, without the host name: the check talks to
its own container on loopback, whose certificate names the service, not
127.0.0.1. With no ``--ca`` it trusts its own loopback. ``--cert``/``--key``
present a client certificate to a server that requires mTLS.

Only the standard library is imported, so a check costs one short Python
start (Docker and Kubernetes run it every few seconds). No token is sent:
``/healthz`` and ``/readyz`` need none.
"""

from __future__ import annotations

import argparse
import http.client
import ssl
import sys

TIMEOUT_S = 3.0


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m framerelay.healthcheck", description=__doc__)
    p.add_argument("port", type=int, help="the service's port on 127.0.0.1")
    p.add_argument("path", nargs="?", default="/readyz", help="default /readyz")
    p.add_argument("--ca", help="CA bundle the server's certificate must chain to")
    p.add_argument("--cert", help="client certificate (mTLS)")
    p.add_argument("--key", help="client key (mTLS)")
    p.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per attempt")
    args = p.parse_args(argv)
    if not 0 < args.port < 65536:
        p.error(f"port must be 1..65535, not {args.port}")
    if not args.path.startswith("/"):
        p.error(f"path must start with '/', not {args.path!r}")
    return args


def _tls_context(args: argparse.Namespace) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=args.ca) if args.ca else ssl.create_default_context()
    ctx.check_hostname = False  # loopback: the certificate names the service, not 127.0.0.1
    if not args.ca:
        ctx.verify_mode = ssl.CERT_NONE
    if args.cert:
        ctx.load_cert_chain(args.cert, args.key)
    return ctx


def _status(conn: http.client.HTTPConnection, path: str) -> int:
    try:
        conn.request("GET", path, headers={"User-Agent": "framerelay-healthcheck"})
        return conn.getresponse().status
    finally:
        conn.close()


def check(args: argparse.Namespace) -> tuple[bool, str]:
    """(healthy, what happened): https first, then http."""
    problems = []
    attempts: list[tuple[str, http.client.HTTPConnection]] = []
    try:
        ctx = _tls_context(args)
        tls = http.client.HTTPSConnection("127.0.0.1", args.port, timeout=args.timeout, context=ctx)
        attempts.append(("https", tls))
    except (OSError, ValueError) as exc:  # unreadable --ca/--cert: still try http
        problems.append(f"https: {exc}")
    attempts.append(("http", http.client.HTTPConnection("127.0.0.1", args.port, args.timeout)))
    for scheme, conn in attempts:
        try:
            status = _status(conn, args.path)
        except (OSError, http.client.HTTPException) as exc:
            problems.append(f"{scheme}: {exc.__class__.__name__}: {exc}")
            continue
        if 200 <= status < 300:
            return True, f"{scheme}://127.0.0.1:{args.port}{args.path} answered {status}"
        problems.append(f"{scheme}: answered {status}")
    return False, f"127.0.0.1:{args.port}{args.path} unhealthy ({'; '.join(problems)})"


def main(argv: list[str] | None = None) -> int:
    healthy, line = check(_parse(sys.argv[1:] if argv is None else argv))
    print(line, file=sys.stdout if healthy else sys.stderr)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
