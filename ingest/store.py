"""Where the ingest keeps the streams added over its API, so a restart resumes them.

Two stores with the same three operations (``load``, ``put``, ``delete``):

* :class:`RedisStore` (``FRAMERELAY_REDIS_URL`` set): one Redis hash
  (``store_key``), field = stream id, value = the definition as JSON. Several
  ingests can share a Redis with different keys.
* :class:`FileStore` (otherwise): a JSON file (``store_path``), rewritten
  atomically (temporary file + rename) with mode 0600.

Definitions are stored with their secrets (``password``, URL credentials):
keep the store as private as the settings. A store that cannot be read or
written raises :class:`StoreError`; the API answers 503 and changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol

import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.exceptions import RedisError

from framerelay.errors import FramerelayError
from ingest.settings import IngestSettings, StreamConfig

FILE_VERSION = 1
REDIS_TIMEOUT_S = 5.0


class StoreError(FramerelayError):
    """The stream store cannot be read or written."""


class StreamStore(Protocol):
    async def load(self) -> list[StreamConfig]: ...
    async def put(self, config: StreamConfig) -> None: ...
    async def delete(self, stream_id: str) -> None: ...
    async def close(self) -> None: ...


def _parse(raw: dict[str, Any], where: str) -> StreamConfig:
    try:
        return StreamConfig.model_validate(raw)
    except ValidationError as exc:
        sid = raw.get("id", "?")
        raise StoreError(f"stream {sid!r} in {where} is invalid: {exc}") from None


class MemoryStore:
    """Keeps nothing across restarts (tests, embedded use)."""

    def __init__(self) -> None:
        self.streams: dict[str, dict[str, Any]] = {}

    async def load(self) -> list[StreamConfig]:
        return [_parse(raw, "memory") for raw in self.streams.values()]

    async def put(self, config: StreamConfig) -> None:
        self.streams[config.id] = config.stored()

    async def delete(self, stream_id: str) -> None:
        self.streams.pop(stream_id, None)

    async def close(self) -> None:
        return None


class FileStore:
    """A JSON file: ``{"version": 1, "streams": [definition, ...]}``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = asyncio.Lock()

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot read the stream store {self.path}: {exc}") from None
        if not isinstance(doc, dict) or doc.get("version") != FILE_VERSION:
            raise StoreError(
                f"{self.path} is not a framerelay stream store (version {FILE_VERSION}); "
                "move it away or set FRAMERELAY_INGEST_STORE_PATH"
            )
        return {s["id"]: s for s in doc.get("streams", []) if isinstance(s, dict) and "id" in s}

    def _write(self, streams: dict[str, dict[str, Any]]) -> None:
        doc = {"version": FILE_VERSION, "streams": list(streams.values())}
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=folder)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except OSError as exc:
            raise StoreError(f"cannot write the stream store {self.path}: {exc}") from None

    async def load(self) -> list[StreamConfig]:
        async with self._lock:
            raw = await asyncio.to_thread(self._read)
        return [_parse(r, str(self.path)) for r in raw.values()]

    async def put(self, config: StreamConfig) -> None:
        async with self._lock:
            streams = await asyncio.to_thread(self._read)
            streams[config.id] = config.stored()
            await asyncio.to_thread(self._write, streams)

    async def delete(self, stream_id: str) -> None:
        async with self._lock:
            streams = await asyncio.to_thread(self._read)
            if streams.pop(stream_id, None) is not None:
                await asyncio.to_thread(self._write, streams)

    async def close(self) -> None:
        return None


class RedisStore:
    """A Redis hash: field = stream id, value = the definition as JSON."""

    def __init__(self, url: str, key: str) -> None:
        self.key = key
        self._redis = aioredis.Redis.from_url(
            url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
        )
        self._where = f"Redis hash {key!r}"

    async def _call(self, what: str, coro: Any) -> Any:
        try:
            async with asyncio.timeout(REDIS_TIMEOUT_S * 2):
                return await coro
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreError(
                f"cannot {what} the {self._where}: {type(exc).__name__}: {exc}"
            ) from None

    async def load(self) -> list[StreamConfig]:
        raw: dict[bytes, bytes] = await self._call("read", self._redis.hgetall(self.key))
        out = []
        for field, value in raw.items():
            try:
                doc = json.loads(value)
            except ValueError:
                raise StoreError(f"stream {field!r} in the {self._where} is not JSON") from None
            out.append(_parse(doc, self._where))
        return out

    async def put(self, config: StreamConfig) -> None:
        value = json.dumps(config.stored())
        await self._call("write", self._redis.hset(self.key, config.id, value))

    async def delete(self, stream_id: str) -> None:
        await self._call("write", self._redis.hdel(self.key, stream_id))

    async def close(self) -> None:
        await self._redis.aclose()


def build_store(settings: IngestSettings) -> StreamStore:
    """Redis when ``redis_url`` is set, else the JSON file at ``store_path``."""
    if settings.redis_url is not None:
        return RedisStore(settings.redis_url.get_secret_value(), settings.store_key)
    return FileStore(settings.store_path)
