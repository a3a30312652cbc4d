"""Settings of sharded ingests (``FRAMERELAY_INGEST_SHARDS__<NAME>``); see :mod:`ingest.shards`."""

from __future__ import annotations

import os
import socket
import uuid

from pydantic import BaseModel, ConfigDict, Field, model_validator

REPLICA_ID = r"^[A-Za-z0-9._:-]{1,64}$"


def default_replica_id() -> str:
    """``<host>-<pid>-<random>``: unique per process, so a restarted replica is a new one."""
    host = "".join(c for c in socket.gethostname() if c.isalnum() or c in "-.")[:32] or "ingest"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class ShardSettings(BaseModel):
    """Several ingest replicas share the streams through Redis (opt-in; needs Redis)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    enabled: bool = Field(
        False,
        description="Shard the streams across the ingest replicas that share this Redis "
        "(leases with fencing epochs); off: this ingest runs every stream itself.",
    )
    replica_id: str = Field(
        default_factory=default_replica_id,
        pattern=REPLICA_ID,
        description="This replica's id (default: host-pid-random, new at every start).",
    )
    lease_ttl_s: float = Field(
        5.0, ge=0.5, le=300, description="A replica or stream lease not renewed for this long "
        "expires: another replica takes its streams over.",
    )  # fmt: skip
    renew_interval_s: float = Field(
        1.0, ge=0.05, le=60, description="Renew leases, look for free streams and routes this "
        "often (at most a quarter of lease_ttl_s).",
    )  # fmt: skip
    rebalance_interval_s: float = Field(
        10.0, ge=0.1, le=3600, description="A replica holding more than its fair share "
        "(ceil(streams / live replicas)) hands one stream over at most this often.",
    )  # fmt: skip
    prefix: str = Field(
        "framerelay:ingest:shards", pattern=r"^[A-Za-z0-9._:-]{1,64}$",
        description="Redis key prefix of leases, routes, snapshots and the transition log.",
    )  # fmt: skip
    snapshot_ttl_s: float = Field(
        3600.0, ge=1, le=30 * 86_400,
        description="A stream's shared tracker snapshot is kept this long after its last write.",
    )  # fmt: skip

    @model_validator(mode="after")
    def _check_times(self) -> ShardSettings:
        if self.renew_interval_s * 4 > self.lease_ttl_s:
            raise ValueError(
                f"shards.renew_interval_s ({self.renew_interval_s:g}) must be at most a quarter "
                f"of shards.lease_ttl_s ({self.lease_ttl_s:g})"
            )
        return self
