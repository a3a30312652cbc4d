"""How the ingest sends streams and opens tunnels, from its settings."""

from __future__ import annotations

from dataclasses import dataclass

from ingest.settings import IngestSettings


@dataclass(frozen=True)
class TunnelOptions:
    """How streams are sent and tunnels opened (the ingest's settings)."""

    max_inflight: int = 4
    frame_timeout_s: float = 10.0
    reconnect_max_s: float = 10.0
    heartbeat_interval_s: float = 0.5
    stall_after_s: float = 3.0
    allow_insecure: bool = False

    @classmethod
    def of(cls, settings: IngestSettings) -> TunnelOptions:
        return cls(
            max_inflight=settings.max_inflight,
            frame_timeout_s=settings.frame_timeout_s,
            reconnect_max_s=settings.reconnect_max_s,
            heartbeat_interval_s=settings.heartbeat_interval_s,
            stall_after_s=settings.stall_after_s,
            allow_insecure=settings.allow_insecure_workers,
        )
