"""A deployment's trust material for benchmarks: an EdDSA key set, a CA (the
orchestrator's own :class:`deploy.ca.PodCA`) and a worker certificate for
127.0.0.1, as env for a worker process and settings for an ingest."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from deploy.ca import CA_CERT, PodCA
from framerelay.auth import KeySet
from framerelay.auth.keys import generate


@dataclass(frozen=True)
class Trust:
    keys: KeySet
    ca: Path
    cert: Path
    key: Path

    def worker_env(self) -> dict[str, str]:
        return {
            "FRAMERELAY_WORKER_TUNNEL_KEYS": self.keys.public().to_json(),
            "FRAMERELAY_WORKER_TLS_CERT": str(self.cert),
            "FRAMERELAY_WORKER_TLS_KEY": str(self.key),
        }

    def ingest_settings(self) -> dict[str, object]:
        return {"signing_keys": self.keys.to_json(), "tls_ca": self.ca}


def make_trust(folder: Path) -> Trust:
    ca = PodCA.load_or_create(folder / "ca")
    cert, key = ca.issue("bench-worker", ["bench-worker.pods.framerelay"], ["127.0.0.1"])
    (folder / "worker.pem").write_text(cert)
    (folder / "worker.key").write_text(key)
    (folder / "worker.key").chmod(0o600)
    keys = KeySet([generate("EdDSA", "bench")])
    return Trust(keys, folder / "ca" / CA_CERT, folder / "worker.pem", folder / "worker.key")
