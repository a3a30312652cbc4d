"""Redis for the benches: the one ``--redis-url`` names, or a private ``redis-server``
on a free port for the run (no persistence, gone afterwards). Never a fixed port."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import redis

from bench.rig.common import free_port

SCHEMES = ("redis", "rediss", "unix")
HELP = ("Redis to use, e.g. redis://127.0.0.1:6379/0 (the bench's keys get a prefix of "
        "their own and are deleted afterwards); default: a private redis-server on a free "
        "port for this run")  # fmt: skip


def add_redis_url(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis-url", type=redis_url_arg, metavar="URL", help=HELP)


def redis_url_arg(text: str) -> str:
    """An argparse type: a Redis URL, or a usage error naming the schemes."""
    if urlsplit(text).scheme not in SCHEMES:
        raise argparse.ArgumentTypeError(
            f"not a Redis URL (redis://, rediss:// or unix://): {shown(text)!r}"
        )
    return text


def shown(url: str) -> str:
    """``url`` without its password (for messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")).geturl()


@contextlib.contextmanager
def redis_for_bench(url: str | None, name: str) -> Iterator[str]:
    """``url`` once it answers PING, else a private redis-server's URL while the block runs."""
    if url is not None:
        _ping(url, 5.0, name)
        yield url
        return
    exe = shutil.which("redis-server")
    if exe is None:
        sys.exit(f"{name}: redis-server is not installed: install it (scripts/services.sh) "
                 "or pass --redis-url")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix=f"{name}-redis-") as work:
        port = free_port()
        proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--dir", work],
                                stdout=subprocess.DEVNULL)  # fmt: skip
        try:
            private = f"redis://127.0.0.1:{port}/0"
            _ping(private, 10.0, name, proc)
            yield private
        finally:
            proc.terminate()
            proc.wait(10)


def _ping(
    url: str, timeout_s: float, name: str, proc: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout_s
    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2)
    try:
        while True:
            try:
                client.ping()
                return
            except redis.RedisError as e:
                if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
                    sys.exit(f"{name}: cannot reach Redis at {shown(url)}: {e}")
                time.sleep(0.1)
    finally:
        client.close()


async def delete_prefix(client: redis.asyncio.Redis, prefix: str) -> int:
    """Delete every key under ``prefix`` (what a bench left on a shared Redis)."""
    gone = 0
    async for key in client.scan_iter(match=f"{prefix}*", count=500):
        gone += int(await client.delete(key))
    return gone
