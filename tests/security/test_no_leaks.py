"""No secret, anywhere: every service runs with secrets set, errors are provoked,
and everything the test can see is searched for each secret.

Secrets (random per run): the signing key set's private ``d`` (a 0600 key file),
an HS256 ``FRAMERELAY_TOKEN_SECRETS`` secret, the RunPod API key, a Redis
password (a private redis-server with ``requirepass``, from a config file) and
a camera password (in stream URLs and the ``password`` field, given through the
ingest and the orchestrator APIs).

Provoked: bad config (each service started with a malformed key set or a bad
setting value: exit 2, one line), 422s with the secrets in the body, failed
authentication with tokens that are or contain the secrets, failed pod creates
and provider 500s (the RunPod API v2 contract server), camera URLs that cannot be
opened. Searched: every process's stdout, stderr and log file, every response
body and header, ``/metrics`` of the ingest, the orchestrator and the worker,
``/proc/<pid>/cmdline`` of every process started and the environment of the
worker pod; each secret raw, URL-encoded and base64-encoded.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidMessage, InvalidStatus

from bench.rig.runpod_v2_contract import ContractServer, running_runpod_v2
from deploy.ca import PodCA
from framerelay.auth import KeySet
from framerelay.launcher import LocalWorker
from tests.conftest import MODEL, TIMEOUT_FACTOR
from tests.security.evidence import Evidence, Secrets, redis_with_password
from tests.security.forge import JWT, hs256
from tests.security.procs import Service, bearer, ready_line, spawn, wait_healthy
from tests.support.auth import mint
from tests.support.servers import free_port
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.integration
GPU = "NVIDIA RTX A4000"
MANY = "1000000"


def _env(s: Secrets, keys_file: Path) -> dict[str, str]:
    return {"FRAMERELAY_SIGNING_KEYS_FILE": str(keys_file), "FRAMERELAY_TOKEN_SECRETS": s.hs}


BAD_CONFIGS: list[tuple[str, list[str], dict[str, str]]] = [
    ("ingest malformed key set", ["ingest", "--api-port", "0"],
     {"FRAMERELAY_SIGNING_KEYS": "{bad}"}),
    ("ingest bad value", ["ingest"], {"FRAMERELAY_INGEST_API_PORT": "{hs}"}),
    ("ingest redis down", ["ingest", "--api-port", "0"], {"FRAMERELAY_REDIS_URL": "{redis_down}"}),
    ("orchestrator malformed key set", ["orchestrator", "--port", "0"],
     {"FRAMERELAY_SIGNING_KEYS": "{bad}"}),
    ("orchestrator bad value", ["orchestrator", "--port", "0"], {"FRAMERELAY_ORCH_TICK_S": "{hs}"}),
    ("orchestrator key in wrong shape", ["orchestrator", "--port", "0"],
     {"FRAMERELAY_ORCH_RUNPOD": '{{"api_key": ["{runpod}"]}}'}),
    ("worker with a private key set", ["worker", "--port", "0"],
     {"FRAMERELAY_WORKER_TUNNEL_KEYS": "{private}"}),
    ("worker bad value", ["worker", "--port", "0"], {"FRAMERELAY_WORKER_MAX_BATCH": "{hs}"}),
]  # fmt: skip


OVERRIDES = (
    ("FRAMERELAY_SIGNING_KEYS", "FRAMERELAY_SIGNING_KEYS_FILE"),
    ("FRAMERELAY_ORCH_RUNPOD", "FRAMERELAY_ORCH_RUNPOD__API_KEY"),
)
NOWHERE = {  # a case that starts after all touches nothing shared
    "FRAMERELAY_ORCH_REDIS_URL": "redis://127.0.0.1:9/0",
    "FRAMERELAY_ORCH_TIERS": '[{"name": "ondemand", "max_workers": 0}]',
}


def _bad_runs(s: Secrets, tmp: Path) -> list[tuple[str, Service]]:
    """Each service started with one bad setting and every secret set (the key file unless
    the case gives the key set itself)."""
    keys_file = tmp / "signing.jwks"
    keys_file.write_text(s.keys.to_json())
    jwk = {**next(iter(s.keys)).jwk, "x": "not-a-point"}
    values = {"bad": json.dumps({"keys": [jwk]}), "hs": s.hs, "runpod": s.runpod,
              "private": s.keys.to_json(),
              "redis_down": f"redis://:{s.redis}@127.0.0.1:{free_port()}/0"}  # fmt: skip
    runs = []
    for i, (name, args, env) in enumerate(BAD_CONFIGS):
        given = {k: v.format(**values) for k, v in env.items()}
        base = {**_env(s, keys_file), "FRAMERELAY_ORCH_RUNPOD__API_KEY": s.runpod,
                "FRAMERELAY_INGEST_STORE_PATH": str(tmp / "streams.json"), **NOWHERE}  # fmt: skip
        for over, drop in OVERRIDES:
            if over in given:
                del base[drop]
        runs.append((name, spawn(f"bad-{i}", args, {**base, **given}, tmp)))
    return runs


def test_bad_config_exits_2_with_one_line_and_no_secret(tmp_path: Path) -> None:
    s = Secrets()
    runs = _bad_runs(s, tmp_path)
    evidence = Evidence()
    try:
        for name, svc in runs:
            svc.proc.wait(60 * TIMEOUT_FACTOR)
            err = svc.err.read_text()
            assert svc.proc.returncode == 2, (name, err[-1500:])
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (name, err)
            evidence.add(f"{name}: output", svc.output())
    finally:
        for _, svc in runs:
            svc.stop(5)
    leaks = evidence.found(s.named())
    assert not leaks, "\n".join(leaks)


def test_the_search_finds_every_form() -> None:
    s = Secrets()
    auth = base64.b64encode(f"admin:{s.camera}".encode()).decode()
    for text in (f"x{s.camera}y", quote(f"p={s.hs}/"), f"Basic {auth}", s.keys.to_json()):
        evidence = Evidence()
        evidence.add("text", text)
        assert evidence.found(s.named()), text


@dataclass
class World:
    s: Secrets
    tmp: Path
    state: ContractServer
    ingest: Service
    orch: Service
    pods: list[LocalWorker] = field(default_factory=list)
    evidence: Evidence = field(default_factory=Evidence)
    redis: subprocess.Popen[bytes] | None = None
    waiting: str = ""
    """What the last wait saw (for its failure message)."""
    pod_name: str = ""
    """The certificate name of the ready pod (its https URL is an IP address)."""

    def call(self, where: str, method: str, url: str, **kw: Any) -> httpx.Response:
        if url.startswith("https://"):
            kw["extensions"] = {"sni_hostname": self.pod_name}
        with httpx.Client(timeout=20, verify=self.tls()) as http:
            return self.evidence.response(where, http.request(method, url, **kw))

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.tmp / "ca" / "ca.pem"))

    def admin(self, aud: str, *scopes: str) -> dict[str, str]:
        return bearer(mint(self.s.keys, scopes, aud))


def _launcher(world: list[World]) -> Any:
    def launch(pod: dict[str, Any]) -> tuple[str, int, Any]:
        w = world[0]
        env = dict(pod["env"])  # what the container would see
        w.evidence.add(f"pod {pod['name']} env at the provider", json.dumps(env))
        env.pop("FRAMERELAY_WORKER_HOST", None)
        worker = LocalWorker(worker_id=env.pop("FRAMERELAY_WORKER_WORKER_ID"), env=env,
                             args=["--model", str(MODEL), "--threads", "1"],
                             log_path=w.tmp / f"pod-{len(w.pods)}.log")  # fmt: skip
        w.pods.append(worker)
        worker.start(120 * TIMEOUT_FACTOR)
        return "127.0.0.1", int(worker.url.rsplit(":", 1)[1].split("/")[0]), worker.stop

    return launch


def _services(s: Secrets, tmp: Path, base: str, redis_url: str) -> tuple[Service, Service]:
    keys_file = tmp / "signing.jwks"
    keys_file.write_text(s.keys.to_json())
    keys_file.chmod(0o600)
    ca = PodCA.load_or_create(tmp / "ca")
    port = free_port()
    ingest = spawn("ingest", ["ingest", "--api-port", str(port), "--worker-url",
                              "ws://127.0.0.1:9/v1/tunnel", "--tls-ca", str(ca.cert_path)], {
        **_env(s, keys_file), "FRAMERELAY_REDIS_URL": redis_url,
        "FRAMERELAY_INGEST_AUTH_MAX_FAILURES": MANY,
    }, tmp)  # fmt: skip
    wait_healthy(ingest, f"http://127.0.0.1:{port}")
    tier = {"name": "ondemand", "min_warm": 1, "max_workers": 1, "capacity_fps": 12}
    orch = spawn("orchestrator", ["orchestrator", "--port", "0", "--provider", "runpod",
                                  "--ingest-url", ingest.url], {
        **_env(s, keys_file), "FRAMERELAY_ORCH_REDIS_URL": redis_url,
        "FRAMERELAY_ORCH_RUNPOD__API_KEY": s.runpod, "FRAMERELAY_ORCH_RUNPOD__BASE_URL": base,
        "FRAMERELAY_ORCH_RUNPOD__BACKOFF_S": "0.01", "FRAMERELAY_ORCH_RUNPOD__MAX_RETRIES": "1",
        "FRAMERELAY_ORCH_RUNPOD__CATALOG_TTL_S": "0.2",
        "FRAMERELAY_ORCH_CA_DIR": str(tmp / "ca"), "FRAMERELAY_ORCH_TIERS": json.dumps([tier]),
        "FRAMERELAY_ORCH_TICK_S": "0.2", "FRAMERELAY_ORCH_CREATE_BACKOFF_S": "0.2",
        "FRAMERELAY_ORCH_CREATE_BACKOFF_MAX_S": "0.5", "FRAMERELAY_ORCH_AUTH_MAX_FAILURES": MANY,
        "FRAMERELAY_ORCH_CANARY_TIMEOUT_S": str(30 * TIMEOUT_FACTOR),
    }, tmp)  # fmt: skip
    wait_healthy(orch, ready_line(orch)["url"])
    return ingest, orch


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    s, tmp = Secrets(), tmp_path_factory.mktemp("leaks")
    redis, port = redis_with_password(tmp, s.redis)
    holder: list[World] = []
    state = ContractServer(s.runpod, launcher=_launcher(holder))
    state.knobs.fail_next = 3  # provider 500s
    state.knobs.no_stock = {(GPU, "*")}  # pod creates refused (no stock)
    started: list[Service] = []
    try:
        with running_runpod_v2(state) as base:
            started += _services(s, tmp, base, f"redis://:{s.redis}@127.0.0.1:{port}/0")
            holder.append(World(s, tmp, state, started[0], started[1], redis=redis))
            yield holder[0]
    finally:
        for svc in reversed(started):
            svc.stop()
        for pod in holder[0].pods if holder else []:
            pod.stop()
        redis.terminate()
        redis.wait(10)


def _provoke_ingest(w: World) -> None:
    cam, url = w.s.camera, w.ingest.url
    write = w.admin("ingest", "streams:write", "routing:write")
    for body in (
        {"id": "cam-1", "url": f"rtsp://admin:{cam}@127.0.0.1:1/x", "open_timeout_s": 2},
        {"id": "cam-2", "url": f"bogus://admin:{cam}@127.0.0.1/x"},
        {"id": "cam-3", "url": "rtsp://127.0.0.1:1/y", "username": "u", "password": cam,
         "options": {"headers": f"Authorization: Basic {cam}"}},
        {"id": "bad id!", "url": f"rtsp://admin:{cam}@127.0.0.1:1/x", "fps": -1, "password": cam},
        {"id": "cam-4", "url": f"rtsp://admin:{cam}@127.0.0.1:1/x", "username": "a"},
    ):  # fmt: skip
        w.call("ingest POST /v1/streams", "POST", f"{url}/v1/streams", json=body, headers=write)
    broken = {**write, "content-type": "application/json"}
    w.call("ingest POST broken json", "POST", f"{url}/v1/streams", headers=broken,
           content=f'{{"url": "{cam}"'.encode())  # fmt: skip
    worker = {"worker_id": "w", "url": f"ws://u:{cam}@example.com:1/v1/tunnel"}
    w.call("ingest PUT worker", "PUT", f"{url}/v1/streams/cam-1/worker", json=worker, headers=write)


def _bad_tokens(s: Secrets) -> list[str]:
    """Tokens that are, or are made with, the secrets. (Not a secret as the ``kid``: key ids
    are public names, and refusals name the unknown one on purpose, for rotation.)"""
    kid = next(iter(s.keys)).kid
    hs_kid = next(iter(KeySet.from_secrets([s.hs]))).kid
    return [
        s.hs, s.d, s.runpod, s.camera, json.dumps(s.keys.to_jwks(), separators=(",", ":")),
        mint(s.hs, ["fleet:*", "streams:*", "worker:*"], "worker"),  # right key, wrong audience
        mint(s.hs, ["fleet:*", "streams:*", "worker:*"], "ingest", now=time.time() - 7200),
        hs256(s.hs.encode(), kid)({"sub": s.camera, "aud": "framerelay-ingest"}),  # alg mix-up
        hs256(s.d.encode(), hs_kid)({"sub": s.camera, "aud": "framerelay-ingest"}),
    ]  # fmt: skip


async def _provoke_auth(w: World, pod_http: str) -> None:
    for token in _bad_tokens(w.s):
        auth = bearer(token)
        for where, url in (("ingest", f"{w.ingest.url}/v1/streams"),
                           ("orchestrator", f"{w.orch.url}/v1/fleet"), ("pod", f"{pod_http}/info"),
                           ("ingest", f"{w.ingest.url}/v1/routing")):  # fmt: skip
            w.call(f"{where} bad token", "GET", url, headers=auth)
        for ws in (w.ingest.url.replace("http", "ws") + "/v1/results",
                   pod_http.replace("https", "wss") + "/v1/tunnel"):  # fmt: skip
            tls = ("wss" in ws, w.tls(), w.pod_name)
            with pytest.raises(InvalidStatus) as refused:
                try:  # a refusal is an HTTP answer (401/403), never a silent close
                    await _open_websocket(ws, auth, *tls)
                except InvalidMessage as exc:
                    raise AssertionError(f"{ws}: no HTTP answer to a bad token: {exc!r}") from exc
            w.evidence.add(f"{ws} bad token", bytes(refused.value.response.body or b""))


async def _open_websocket(
    url: str, headers: dict[str, str], secure: bool, tls: ssl.SSLContext, name: str
) -> None:
    """Open (and close) a WebSocket with the asyncio client. Not the sync client: over
    TLS its receiving thread reads the SSL socket while the opening request is written,
    and CPython's SSL sockets are not safe for that (about 1 in 800 requests was never
    sent under load, and the worker's refusal looked like a silent close)."""
    async with connect(url, additional_headers=headers, ssl=tls if secure else None,
                       server_hostname=name if secure else None,
                       open_timeout=20 * TIMEOUT_FACTOR, proxy=None):  # fmt: skip
        pass


def _provoke_orchestrator(w: World) -> None:
    cam, url, write = w.s.camera, w.orch.url, w.admin("orchestrator", "fleet:write")
    for body in ({"id": "bad id!", "url": f"rtsp://u:{cam}@127.0.0.1:1/z", "fps": -1},
                 {"id": "cam-9", "url": f"rtsp://u:{cam}@127.0.0.1:1/z"}):  # fmt: skip
        w.call("orchestrator POST /v1/streams", "POST", f"{url}/v1/streams", json=body,
               headers=write)  # fmt: skip
    w.call("orchestrator POST /v1/pods", "POST", f"{url}/v1/pods", json={"tier": "ondemand"},
           headers=write)  # fmt: skip


def _pod_ready(w: World) -> str | None:
    pods = w.call("orch pods", "GET", f"{w.orch.url}/v1/pods",
                  headers=w.admin("orchestrator", "fleet:read")).json()  # fmt: skip
    ready = next((p for p in pods if p["ready"]), None)
    if ready is None:
        return None
    w.pod_name = ready["tls_server_name"]
    return str(ready["http_url"])


def _collect(w: World, pod_http: str) -> None:
    read = w.admin("ingest", "streams:read")
    fleet = w.admin("orchestrator", "fleet:read")
    for where, url, headers in (
        ("ingest streams", f"{w.ingest.url}/v1/streams", read),
        ("ingest cam-1", f"{w.ingest.url}/v1/streams/cam-1", read),
        ("ingest cam-9", f"{w.ingest.url}/v1/streams/cam-9", read),
        ("ingest routing", f"{w.ingest.url}/v1/routing", read),
        ("ingest metrics", f"{w.ingest.url}/metrics", {}),
        ("orchestrator fleet", f"{w.orch.url}/v1/fleet", fleet),
        ("orchestrator streams", f"{w.orch.url}/v1/streams", fleet),
        ("orchestrator metrics", f"{w.orch.url}/metrics", {}),
        ("pod metrics", f"{pod_http}/metrics", {}),
    ):  # fmt: skip
        w.call(where, "GET", url, headers=headers)
    assert w.redis is not None
    w.evidence.add("redis-server cmdline", Path(f"/proc/{w.redis.pid}/cmdline").read_bytes())
    w.ingest.remember()
    w.orch.remember()
    for svc in (w.ingest, w.orch):
        w.evidence.add(f"{svc.name} cmdline", svc.seen["cmdline"])
    for pod in w.pods:
        assert pod.proc is not None
        proc = Path(f"/proc/{pod.proc.pid}")
        w.evidence.add("pod cmdline", (proc / "cmdline").read_bytes())
        w.evidence.add("pod environ", (proc / "environ").read_bytes())  # its own TLS key: ok


def _errored(w: World) -> bool:
    streams = w.call("ingest streams", "GET", f"{w.ingest.url}/v1/streams",
                     headers=w.admin("ingest", "streams:read")).json()  # fmt: skip
    errors = {s["id"]: s["last_error"] for s in streams}
    w.waiting = f"ingest streams and their last errors: {errors}"
    # cam-2 (bogus://) is refused when defined (422, unknown scheme): its answer is evidence
    assert "cam-2" not in errors, "a bogus:// URL must be refused when the stream is defined"
    return all(errors.get(i) for i in ("cam-1", "cam-3", "cam-9"))


async def test_no_secret_in_logs_bodies_metrics_or_command_lines(world: World) -> None:
    w = world
    await wait_until_async(
        lambda: w.orch.output().count("no stock for") >= 3,
        30,
        "creates refused: no stock",
        every_s=0.2,
    )
    w.state.knobs.no_stock.clear()  # a create gets through: a real worker pod, ...
    w.state.knobs.fail_next = 4  # ... after more provider 500s
    _provoke_ingest(w)
    _provoke_orchestrator(w)
    pod_http = await wait_until_async(lambda: _pod_ready(w), 90, "a ready pod", every_s=0.2)
    await wait_until_async(
        lambda: _errored(w), 30, lambda: f"every camera failed ({w.waiting})", every_s=0.2
    )
    await _provoke_auth(w, pod_http)
    _collect(w, pod_http)
    for svc in (w.orch, w.ingest):  # their shutdown logs too
        assert svc.stop() == 0, svc.output()[-2000:]
    for log in (
        sorted(w.tmp.glob("*.out")) + sorted(w.tmp.glob("*.err")) + sorted(w.tmp.glob("*.log"))
    ):
        w.evidence.add(f"log {log.name}", log.read_bytes())
    seen = [(e.method, e.path, e.query_names, e.status) for e in w.state.exchanges]
    w.evidence.add("contract server requests", json.dumps(seen))
    assert not w.state.key_in_url
    leaks = w.evidence.found(w.s.named())
    assert not leaks, "\n".join(leaks)
    tokens = [(where, m) for where, text in w.evidence.items if where.startswith("log ")
              for m in JWT.findall(text.encode())]  # fmt: skip
    assert not tokens, tokens[:5]  # no bearer token in any log either
    logs = {where: text for where, text in w.evidence.items if where.startswith("log ")}
    assert (
        "HTTP 500" in logs["log orchestrator.err"] and "no_capacity" in logs["log orchestrator.err"]
    )
    assert logs["log ingest.err"].count("cannot open") >= 4  # the provoked errors happened
    answers = [where.rsplit(" ", 1)[-1] for where, _ in w.evidence.items if " -> " in where]
    assert answers.count("422") >= 4 and answers.count("401") >= 30, answers
