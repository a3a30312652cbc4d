"""What the ingest was told about each stream, and telling it again when that changes.

The fleet's placement says where each stream runs (a worker, a serverless endpoint, or
nowhere); :class:`IngestSync` remembers what the ingest acknowledged (the place and the
stream's definition key) and calls it only for a stream whose place or definition
changed. A call that fails is made again on the next pass (the acknowledgement is kept
only on success).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from deploy.ingest_link import IngestLink, definition_key
from deploy.models import PodRecord, StreamSpec, WorkerState
from deploy.serverless_jobs import SERVERLESS, endpoint_of, withdraw

log = logging.getLogger(__name__)
Workers = Mapping[str, tuple[PodRecord, WorkerState]]


@dataclass
class IngestSync:
    ingest: IngestLink
    redefined: Callable[[str, str], None]
    """Called with (worker, stream) when a stream is taken off to be placed again."""
    acked: dict[str, tuple[str | None, str]] = field(default_factory=dict)
    """stream -> (worker or :data:`SERVERLESS`, definition key) the ingest acknowledged."""

    async def forget_gone(self, streams: Iterable[str]) -> None:
        """Take streams that are no longer declared off the ingest."""
        for sid in set(self.acked) - set(streams):
            if await withdraw(self.ingest, sid, self.acked[sid][0]):
                self.acked.pop(sid, None)

    async def tell(self, spec: StreamSpec, want: str | None, workers: Workers) -> None:
        """Tell the ingest where ``spec`` runs, unless it acknowledged that already.

        The ingest keeps a placed stream's definition (a PUT only moves it), so a stream
        whose definition changed, even removed and re-added between two passes, is taken
        off the ingest first, then placed again with the new definition.
        """
        sid, rev = spec.id, definition_key(spec)
        want = SERVERLESS if endpoint_of(spec) is not None else want  # no worker: its endpoint
        acked = self.acked.get(sid)
        if acked == (want, rev):
            return
        if acked is not None and acked[0] is not None and acked[1] != rev:
            if not await withdraw(self.ingest, sid, acked[0]):
                return
            self.redefined(acked[0], sid)
            self.acked[sid] = (None, acked[1])
        if want is None:
            ok = await withdraw(self.ingest, sid, acked[0] if acked else None)
        elif want == SERVERLESS:
            ok = await self.ingest.serve(spec)
        else:
            worker = workers[want][1]
            url, name = worker.tunnel_url, worker.tls_server_name
            ok = url is not None and await self.ingest.assign(spec, want, url, name)
        if ok:
            self.acked[sid] = (want, rev)
