"""A stolen pod cannot produce a token that any service accepts.

A real deployment on 127.0.0.1, every service a process of its own: an EdDSA
signing key set in a 0600 file, ``framerelay ingest`` (verifying pods against
the orchestrator's CA), ``framerelay orchestrator`` with the local provider
and local TLS (so it starts a real worker pod with its own certificate and
only the public key set), and another worker started the same way (the
victim). A stream is placed on the pod, so the pod has been sent a tunnel
token and a canary token. Then the test takes everything the pod holds (its
environment, argv, the files they name or it has open, the tokens in its
memory) and tries every token it can make or replay on the ingest API, the
orchestrator API and the other worker: all refused (401/403; throttles set
high so 429 never hides an answer), nothing changed, no result delivered.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from framerelay.auth import KeySet
from framerelay.auth.tokens import AUD_INGEST, AUD_ORCHESTRATOR, AUD_WORKER
from framerelay.launcher import LocalWorker
from tests.conftest import MODEL, TIMEOUT_FACTOR
from tests.security.forge import AUDIENCES, Loot, claims, forge, harvest
from tests.security.procs import (
    Service,
    bearer,
    ready_line,
    redis_prefix,
    run_cli,
    spawn,
    wait_healthy,
    worker_children,
)
from tests.support.auth import ed_keys, mint
from tests.support.servers import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
POD, OTHER, STREAM = "fr-ondemand-0-g0", "gpu-other", "cam-1"
MANY = "1000000"  # failed authentications per window: the throttles never answer 429
TIER = {"name": "ondemand", "min_warm": 1, "max_workers": 1, "capacity_fps": 12}
AUD = {"ingest": AUD_INGEST, "orchestrator": AUD_ORCHESTRATOR, "worker": AUD_WORKER}
TARGETS: list[tuple[str, str, str, Any]] = [
    ("ingest", "GET", "/v1/streams", None),
    ("ingest", "POST", "/v1/streams", {"id": "evil", "url": "rtsp://127.0.0.1:1/evil"}),
    ("ingest", "PUT", f"/v1/streams/{STREAM}/worker",
     {"worker_id": "evil", "url": "ws://127.0.0.1:9/v1/tunnel"}),
    ("ingest", "WS", "/v1/results", None),  # every stream: needs results:*
    ("ingest", "WS", f"/v1/results?stream={STREAM}", None),
    ("orchestrator", "GET", "/v1/fleet", None),
    ("orchestrator", "POST", "/v1/pods", {"tier": "ondemand"}),
    ("worker", "WS", "/v1/tunnel", None),
    ("worker", "GET", "/info", None),
]  # fmt: skip


@dataclass
class Deployment:
    keys: KeySet
    ingest: Service
    orch: Service
    other: LocalWorker
    ca: Path
    pod_pid: int

    def auth(self, service: str, *scopes: str) -> dict[str, str]:
        return bearer(mint(self.keys, scopes, service))

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def base(self, service: str) -> str:
        if service == "worker":
            return self.other.url.replace("wss://", "https://").removesuffix("/v1/tunnel")
        return self.ingest.url if service == "ingest" else self.orch.url


def _pod_ready(orch: str, auth: dict[str, str]) -> bool:
    pods = httpx.get(f"{orch}/v1/pods", headers=auth, timeout=5).json()
    return any(p["name"] == POD and p["ready"] for p in pods)


def _routed(ingest: str, auth: dict[str, str]) -> bool:
    routing = httpx.get(f"{ingest}/v1/routing", headers=auth, timeout=5).json()
    return bool(routing.get(STREAM) == POD)


def _start_all(tmp: Path, keys: KeySet, keys_file: Path, prefix: str) -> tuple[Service, Service]:
    ca = tmp / "ca"
    ingest_port = free_port()
    ingest = spawn("ingest", ["ingest", "--api-port", str(ingest_port), "--tls-ca",
                              str(ca / "ca.pem"), "--worker-url", "ws://127.0.0.1:9/v1/tunnel"], {
        "FRAMERELAY_SIGNING_KEYS_FILE": str(keys_file), "FRAMERELAY_INGEST_AUTH_MAX_FAILURES": MANY,
        "FRAMERELAY_INGEST_STORE_PATH": str(tmp / "streams.json"),
    }, tmp / "logs")  # fmt: skip
    wait_healthy(ingest, f"http://127.0.0.1:{ingest_port}")
    orch = spawn("orchestrator", ["orchestrator", "--port", "0", "--provider", "local",
                                  "--ingest-url", ingest.url], {
        "FRAMERELAY_SIGNING_KEYS_FILE": str(keys_file), "FRAMERELAY_ORCH_KEY_PREFIX": prefix,
        "FRAMERELAY_ORCH_CA_DIR": str(ca), "FRAMERELAY_ORCH_TIERS": json.dumps([TIER]),
        "FRAMERELAY_ORCH_TICK_S": "0.3", "FRAMERELAY_ORCH_LOCAL__TLS": "true",
        "FRAMERELAY_ORCH_LOCAL__MODEL": str(MODEL), "FRAMERELAY_ORCH_LOCAL__THREADS": "1",
        "FRAMERELAY_ORCH_CANARY_INTERVAL_S": "600", "FRAMERELAY_ORCH_UNHEALTHY_AFTER": "10",
        "FRAMERELAY_ORCH_CANARY_TIMEOUT_S": str(30 * TIMEOUT_FACTOR),
        "FRAMERELAY_ORCH_HEARTBEAT_TIMEOUT_S": "10", "FRAMERELAY_ORCH_AUTH_MAX_FAILURES": MANY,
    }, tmp / "logs")  # fmt: skip
    wait_healthy(orch, ready_line(orch)["url"])
    return ingest, orch


def _other_worker(tmp: Path, keys: KeySet) -> LocalWorker:
    """Another pod as the orchestrator makes one: its own certificate, the public keys."""
    made = run_cli(["ca", "issue", "--dir", str(tmp / "ca"), "--name", f"{OTHER}.pods.framerelay",
                    "--ip", "127.0.0.1", "--out", str(tmp / OTHER)], {})  # fmt: skip
    assert made.returncode == 0, made.stderr
    env = {
        "FRAMERELAY_WORKER_TUNNEL_KEYS": keys.public().to_json(),
        "FRAMERELAY_WORKER_TLS_CERT": str(tmp / f"{OTHER}.pem"),
        "FRAMERELAY_WORKER_TLS_KEY": str(tmp / f"{OTHER}.key"),
        "FRAMERELAY_WORKER_AUTH_MAX_FAILURES": MANY,
    }  # fmt: skip
    args = ["--model", str(MODEL), "--threads", "1"]
    worker = LocalWorker(worker_id=OTHER, args=args, env=env, log_path=tmp / "logs/other.log")
    return worker.start(120 * TIMEOUT_FACTOR)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    keys = ed_keys("primary-2024")
    keys_file = tmp_path / "signing.jwks"
    keys_file.write_text(keys.to_json())
    keys_file.chmod(0o600)
    assert run_cli(["ca", "init", "--dir", str(tmp_path / "ca")], {}).returncode == 0
    started: list[Service] = []
    other: LocalWorker | None = None
    with redis_prefix("stolen") as prefix:
        try:
            started += _start_all(tmp_path, keys, keys_file, prefix)
            ingest, orch = started
            other = _other_worker(tmp_path, keys)
            d = Deployment(keys, ingest, orch, other, tmp_path / "ca" / "ca.pem", 0)
            fleet = d.auth("orchestrator", "fleet:read", "fleet:write")
            wait_until(lambda: _pod_ready(orch.url, fleet), 180, f"pod {POD} ready", every_s=0.2)
            made = httpx.post(f"{orch.url}/v1/streams", headers=fleet,
                              json={"id": STREAM, "url": "rtsp://127.0.0.1:1/cam"})  # fmt: skip
            assert made.status_code == 201, made.text
            wait_until(
                lambda: _routed(ingest.url, d.auth("ingest", "streams:read")),
                60,
                f"{STREAM} routed to {POD}",
                every_s=0.2,
            )
            (d.pod_pid,) = worker_children(orch.proc.pid)
            yield d
        finally:
            for svc in reversed(started):
                svc.stop()
            if other is not None:
                other.stop()


async def _try(http: httpx.AsyncClient, d: Deployment, target: tuple[str, str, str, Any],
               token: str) -> int:  # fmt: skip
    service, method, path, body = target
    base = d.base(service)
    if method != "WS":
        resp = await http.request(method, base + path, json=body, headers=bearer(token))
        return resp.status_code
    url = base.replace("http", "ws", 1) + path
    try:
        async with connect(url, additional_headers=bearer(token), proxy=None, open_timeout=20,
                           ssl=d.tls() if url.startswith("wss") else None):  # fmt: skip
            return 101
    except InvalidStatus as exc:
        return exc.response.status_code


async def attack(d: Deployment, tokens: list[tuple[str, str, str | None]]) -> list[tuple[str, int]]:
    """Every token on every target of its audience (``None``: every target)."""
    answers: list[tuple[str, int]] = []
    async with httpx.AsyncClient(verify=d.tls(), timeout=20) as http:
        for how, token, aud in tokens:
            for target in TARGETS:
                if aud is None or AUD[target[0]] == aud:
                    where = f"{how} [{aud or 'all'}] -> {target[0]} {target[1]} {target[2]}"
                    answers.append((where, await _try(http, d, target, token)))
    return answers


def _metric(text: str, name: str) -> float:
    values = [s.value for f in text_string_to_metric_families(text) for s in f.samples
              if s.name == name]  # fmt: skip
    assert values, f"no {name} in /metrics"
    return sum(values)


def state(d: Deployment) -> dict[str, Any]:
    """What an accepted forged token could change (no counters that tick on their own)."""
    read = d.auth("ingest", "streams:read")
    fleet = httpx.get(f"{d.orch.url}/v1/fleet", headers=d.auth("orchestrator", "fleet:read")).json()
    other = httpx.get(d.base("worker") + "/metrics", verify=d.tls()).text
    return {
        "ingest streams": sorted((s["id"], s["source"]) for s in
                                 httpx.get(f"{d.ingest.url}/v1/streams", headers=read).json()),
        "routing": httpx.get(f"{d.ingest.url}/v1/routing", headers=read).json(),
        "pods": sorted(p["name"] for p in fleet["pods"]),
        "targets": {t["name"]: t["target"] for t in fleet["tiers"]},
        "fleet streams": sorted((s["id"], s["worker"]) for s in fleet["streams"]),
        "results delivered": _metric(httpx.get(f"{d.ingest.url}/metrics").text,
                                     "framerelay_hub_results_sent_total"),
        "other worker tunnels": _metric(other, "framerelay_worker_tunnels_total"),
        "other worker connections": _metric(other, "framerelay_worker_connections"),
    }  # fmt: skip


def _private(keys: KeySet) -> list[bytes]:
    return [str(v).encode() for k in keys for m, v in k.jwk.items() if m in ("d", "k")]


def _check_loot(loot: Loot, d: Deployment) -> None:
    """The harvest found what a pod is given, and no key that can mint."""
    everything = loot.text()
    assert all(str(k.jwk["x"]).encode() in everything for k in d.keys)  # the public set
    assert b"PRIVATE KEY-----" in everything  # the pod's own TLS key file
    assert any(label.startswith("file ") and label.endswith("key.pem") for label in loot.blobs)
    assert not any(secret in everything for secret in _private(d.keys))
    assert loot.tokens, "the pod's memory holds the tokens it was sent (tunnel, canary)"


async def test_a_stolen_pod_cannot_produce_a_token_any_service_accepts(
    deployment: Deployment,
) -> None:
    d = deployment
    loot = harvest(d.pod_pid)
    _check_loot(loot, d)
    kids = [*d.keys.kids, *(k.kid for k in d.keys.public())]
    tokens = forge(loot, kids)
    assert len(tokens) > 100
    before = state(d)
    assert before["routing"] == {STREAM: POD} and before["pods"] == [POD]
    answers = await attack(d, tokens)
    accepted = [(where, code) for where, code in answers if code not in (401, 403)]
    assert not accepted, accepted[:20]
    assert state(d) == before
    assert before["results delivered"] == 0 and before["other worker tunnels"] == 0
    metrics = await asyncio.to_thread(httpx.get, f"{d.ingest.url}/metrics")
    refused = _metric(metrics.text, "framerelay_ingest_auth_refused_total")
    assert refused >= sum(1 for w, _ in answers if "-> ingest" in w)  # each reached the check
    assert await _control(d) == [200, 101, 200, 200]


async def _control(d: Deployment) -> list[int]:
    """The same claims signed with the real key pass: a refusal above means the key."""
    key = d.keys.signer()
    real = jwt.encode(claims(list(AUDIENCES)), key.signing_key(), algorithm=key.alg,
                      headers={"kid": key.kid})  # fmt: skip
    reads = [t for t in TARGETS if t[1] == "GET" or t[2] == "/v1/results"]
    async with httpx.AsyncClient(verify=d.tls(), timeout=20) as http:
        return [await _try(http, d, t, real) for t in reads]
