"""The ingest service: streams + tunnel client + result bus, with a lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from framerelay.auth import TokenSigner
from framerelay.errors import ConfigError
from framerelay.results import ResultRecord
from framerelay.settings import split_secrets
from ingest.bus import ResultBus
from ingest.settings import IngestSettings, StreamConfig
from ingest.stream import IngestStream
from ingest.tunnel_client import TunnelClient, client_ssl_context

log = logging.getLogger(__name__)
TOKEN_TTL_S = 3600.0
FINISH_POLL_S = 0.1
DRAIN_TIMEOUT_S = 3.0


def token_provider(settings: IngestSettings) -> TokenSigner | str:
    """A fixed token from settings, or a signer to mint a fresh one per connect."""
    if settings.token is not None:
        return settings.token.get_secret_value()
    if settings.token_secrets is None:
        raise ConfigError(
            "no tunnel credentials: set FRAMERELAY_INGEST_TOKEN (a token granting "
            "worker:<id>) or FRAMERELAY_TOKEN_SECRETS (the worker's secrets)"
        )
    return TokenSigner(split_secrets(settings.token_secrets))


class IngestService:
    def __init__(self, settings: IngestSettings) -> None:
        self.settings = settings
        self.bus = ResultBus()
        self._credentials = token_provider(settings)
        ctx = None
        if settings.worker_url.startswith("wss://"):
            ctx = client_ssl_context(
                str(settings.tls_ca) if settings.tls_ca else None,
                str(settings.tls_client_cert) if settings.tls_client_cert else None,
                str(settings.tls_client_key) if settings.tls_client_key else None,
            )
        self.client = TunnelClient(
            settings.worker_url,
            self._token,
            self.bus.publish,
            ssl_context=ctx,
            frame_timeout_s=settings.frame_timeout_s,
            reconnect_max_s=settings.reconnect_max_s,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending = list(settings.streams)

    def _token(self) -> str:
        if isinstance(self._credentials, str):
            return self._credentials
        scope = [f"worker:{self.settings.worker_id}"]
        return self._credentials.mint("ingest", scope, TOKEN_TTL_S)

    @property
    def streams(self) -> dict[str, IngestStream]:
        return self.client.streams

    def add_stream(self, config: StreamConfig) -> IngestStream:
        if config.id in self.client.streams:
            raise ConfigError(f"stream {config.id!r} already exists")
        loop = asyncio.get_running_loop()
        stream = IngestStream(config, loop, self.settings.max_inflight)
        self.client.add(stream)
        return stream

    def publish(self, record: ResultRecord) -> None:
        self.bus.publish(record)

    async def run(self, stop: asyncio.Event, *, until_finished: bool = False) -> None:
        """Run until ``stop`` (or, with ``until_finished``, until every source ended)."""
        for cfg in self._pending:
            self.add_stream(cfg)
        self._pending = []
        client_stop = asyncio.Event()
        client = asyncio.create_task(self.client.run(client_stop), name="tunnel-client")
        try:
            while not stop.is_set():
                if client.done():
                    break
                if (
                    until_finished
                    and self.streams
                    and all(s.finished for s in self.streams.values())
                ):
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(FINISH_POLL_S):
                        await stop.wait()
        finally:
            stop.set()
            for stream in self.streams.values():
                stream.stop()
            await self.client.drain(DRAIN_TIMEOUT_S)
            client_stop.set()
            await client
            for stream in self.streams.values():
                await asyncio.to_thread(stream.join, 5.0)
