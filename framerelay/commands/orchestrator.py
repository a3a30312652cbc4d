"""``framerelay orchestrator``: run the GPU fleet orchestrator (API + reconcile loop).

With ``FRAMERELAY_ORCH_TLS_CERT`` / ``_KEY`` the API is served over HTTPS
(mTLS with ``FRAMERELAY_ORCH_TLS_CLIENT_CA``); the pod CA is in
``FRAMERELAY_ORCH_CA_DIR`` (``framerelay ca init|issue`` manage it). Every
connection passes :mod:`framerelay.listeners` first (``FRAMERELAY_ORCH_LISTENER__*``).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
from typing import Any

HELP = "run the GPU fleet orchestrator: warm pools, health, placement, cost"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "orchestrator",
        help=HELP,
        description=HELP + ". Every setting reads FRAMERELAY_ORCH_<NAME> (nested with __); "
        "keys come from FRAMERELAY_SIGNING_KEYS_FILE (a private key set from 'framerelay keys "
        "generate'; pods get only its public half) or, on one host, FRAMERELAY_TOKEN_SECRETS.",
    )
    p.add_argument("--host", help="API address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="API port (default 8090; 0 = any free port)")
    p.add_argument("--provider", choices=["local", "runpod", "kubernetes"])
    p.add_argument(
        "--redis-url",
        help="Redis holding the fleet state, without a password (a command line is visible to "
        "every user of the host: put one in FRAMERELAY_ORCH_REDIS_URL or ..._REDIS_URL_FILE)",
    )
    p.add_argument("--ingest-url", help="ingest API to push stream assignments to")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from deploy.settings import OrchestratorSettings
    from framerelay.errors import ConfigError
    from framerelay.settings import redis_url_has_password

    if args.redis_url is not None and redis_url_has_password(args.redis_url):
        raise ConfigError(
            "--redis-url holds a password, which every user of this host can read in the "
            "process list: set FRAMERELAY_ORCH_REDIS_URL (or FRAMERELAY_ORCH_REDIS_URL_FILE) "
            "instead"
        )
    keys = ("host", "port", "provider", "redis_url", "ingest_url")
    over = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
    return asyncio.run(_serve(OrchestratorSettings(**over)))


async def _serve(settings: object) -> int:
    import logging

    import uvicorn

    from deploy.api import create_app
    from deploy.service import Orchestrator
    from deploy.settings import OrchestratorSettings
    from deploy.tls import api_ssl_options
    from framerelay.lifecycle import install_signal_handlers
    from framerelay.listeners import ConnectionLimiter, uvicorn_options
    from framerelay.startup import announce_ready, print_ready_json

    assert isinstance(settings, OrchestratorSettings)  # noqa: S101 - built above
    tls = api_ssl_options(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
    orch = Orchestrator(settings)
    stop = asyncio.Event()
    limits = uvicorn_options(ConnectionLimiter(settings.listener, "FRAMERELAY_ORCH_LISTENER"))
    config = uvicorn.Config(
        create_app(orch), host=settings.host, port=settings.port, log_level="warning",
        log_config=None,  # through the root handler: --log-format json covers uvicorn too
        access_log=False, lifespan="off", timeout_graceful_shutdown=5, **limits,
        **tls,  # type: ignore[arg-type]
    )  # fmt: skip
    server = uvicorn.Server(config)
    sock = _listen(settings.host, settings.port)
    install_signal_handlers(stop)
    api = asyncio.create_task(server.serve(sockets=[sock]), name="orchestrator-api")
    loop = asyncio.create_task(orch.run(stop), name="orchestrator-loop")
    for _ in range(600):  # bounded: uvicorn binds within 30 s or has failed
        if server.started or api.done():
            break
        await asyncio.sleep(0.05)
    if server.started:
        port = sock.getsockname()[1]
        scheme = "https" if tls else "http"
        ready = {"event": "ready", "url": f"{scheme}://{settings.host}:{port}"}
        print_ready_json(ready)
        announce_ready("orchestrator API", ready["url"], _loaded(settings))
    try:
        await asyncio.wait({api, loop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.set()
        server.should_exit = True
        await asyncio.gather(api, loop, return_exceptions=True)
        await orch.aclose()
    logging.getLogger("framerelay.startup").info("orchestrator stopped")
    return 0


def _listen(host: str, port: int) -> socket.socket:
    """The API's listening socket, bound before anything starts (a taken port: one line)."""
    from framerelay.startup import bind_error

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(512)
    except OSError as exc:
        sock.close()
        raise bind_error(exc, host, port, "--port / FRAMERELAY_ORCH_PORT") from None
    sock.setblocking(False)
    return sock


def _loaded(settings: Any) -> str:
    """What the orchestrator runs with, for its ready line (no secrets)."""
    tiers = ", ".join(
        f"{t.name} ({'interruptible' if t.interruptible else 'on-demand'}, "
        f"{t.min_warm}..{t.max_workers})"
        for t in settings.tiers
    )
    ingest = settings.ingest_url or "none"
    return f"provider {settings.provider}, tiers {tiers or 'none'}, ingest {ingest}"
