"""The orchestrator API (real server on 127.0.0.1, real Redis): every route but
/healthz needs a scoped token; refusals (401/403/429) come before any effect,
are counted in /metrics and throttled per peer; a 422 echoes no submitted
value (a password in a stream URL included); stream URLs show no password."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from deploy.api import create_app
from deploy.ca import PodCA
from deploy.health import StatusProber
from deploy.ingest_link import NullIngestLink
from deploy.models import StreamSpec
from deploy.service import Orchestrator
from framerelay.auth import KeySet
from framerelay.auth.web import route_scopes
from tests.support.auth import b64url, ed_keys, hs256_by_hand, mint
from tests.support.orchestrator import orch_settings, serving_here

pytestmark = pytest.mark.integration
READ, WRITE = "fleet:read", "fleet:write"
PASSWORD = "S3cretCamPassw0rd"
DOCS = [("GET", p) for p in ("/openapi.json", "/docs", "/redoc", "/docs/assets/{name}")]
"""Open: the API's description (framerelay.openapi_docs), no data."""
EXPECTED_SCOPES = {
    **dict.fromkeys(DOCS),
    ("GET", "/healthz"): None,
    ("GET", "/metrics"): None,
    ("GET", "/v1/fleet"): READ,
    ("GET", "/v1/pods"): READ,
    ("POST", "/v1/pods"): WRITE,
    ("DELETE", "/v1/pods/{name}"): WRITE,
    ("GET", "/v1/streams"): READ,
    ("POST", "/v1/streams"): WRITE,
    ("DELETE", "/v1/streams/{stream_id}"): WRITE,
    ("POST", "/v1/streams/{stream_id}/move"): WRITE,
    ("GET", "/v1/history"): READ,
    ("GET", "/v1/events"): READ,
    ("GET", "/v1/jobs"): "jobs:read",
    ("GET", "/v1/jobs/{job_id}"): "jobs:read",
    ("POST", "/v1/jobs"): "jobs:write",
    ("DELETE", "/v1/jobs/{job_id}"): "jobs:write",
}
ROUTES: list[tuple[str, str, Any]] = [
    ("GET", "/v1/fleet", None),
    ("GET", "/v1/pods", None),
    ("POST", "/v1/pods", {"tier": "ondemand"}),
    ("DELETE", "/v1/pods/fr-ondemand-0-g0", None),
    ("GET", "/v1/streams", None),
    ("POST", "/v1/streams", {"id": "evil", "url": "rtsp://attacker/x"}),
    ("DELETE", "/v1/streams/cam-1", None),
    ("POST", "/v1/streams/cam-1/move", {"worker": "fr-ondemand-0-g0"}),
    ("GET", "/v1/history", None),
    ("GET", "/v1/events?since=0", None),
    ("POST", "/v1/jobs", {"inputs": ["/x.mp4"]}),
    ("GET", "/v1/jobs", None),
    ("GET", "/v1/jobs/night-1", None),
    ("DELETE", "/v1/jobs/night-1", None),
]


@asynccontextmanager
async def api(tmp_path: Path, keys: KeySet, **over: Any) -> AsyncIterator[tuple[Orchestrator, str]]:
    settings = orch_settings(tmp_path, keys, **over)
    orch = Orchestrator(settings, prober=StatusProber(20), ingest=NullIngestLink())
    try:
        async with serving_here(create_app(orch)) as url:
            yield orch, url
    finally:
        await orch.store.clear()
        await orch.aclose()


async def state_of(orch: Orchestrator) -> tuple[Any, ...]:
    s = orch.store
    return (await s.streams(), await s.pods(), await s.floors(), await s.pins(),
            await s.assignments())  # fmt: skip


def forged_tokens(keys: KeySet, tmp_path: Path) -> dict[str, str]:
    """Tokens made with what a worker holds (the public key set, its TLS key) or nothing."""
    kid = keys.kids[0]
    claims = {"iss": "framerelay", "sub": "pod", "aud": "framerelay-orchestrator",
              "scope": "fleet:write fleet:read", "iat": int(time.time()),
              "nbf": int(time.time()), "exp": int(time.time()) + 600}  # fmt: skip
    public = keys.public().get(kid)
    assert public is not None
    x = base64.urlsafe_b64decode(public.jwk["x"] + "==")
    _cert, key_pem = PodCA.load_or_create(tmp_path / "pod-ca").issue("fr-x-0-g0", ["x.pods"])
    tls_key = serialization.load_pem_private_key(key_pem.encode(), None)
    assert isinstance(tls_key, ec.EllipticCurvePrivateKey)  # PodCA's keys are P-256
    header = b64url(json.dumps({"alg": "none", "kid": kid, "typ": "JWT"}).encode())
    return {
        "hs256 with the public key": hs256_by_hand(claims, x, {"kid": kid, "typ": "JWT"}),
        "hs256 with the public jwks": hs256_by_hand(
            claims, keys.public().to_json().encode(), {"kid": kid, "typ": "JWT"}
        ),
        "es256 with a pod's tls key": jwt.encode(claims, tls_key, "ES256", headers={"kid": kid}),
        "alg none": f"{header}.{b64url(json.dumps(claims).encode())}.",
    }


def bad_tokens(keys: KeySet, tmp_path: Path) -> dict[str, tuple[str | None, int]]:
    now = time.time()
    kid = keys.kids[0]
    impostor = ed_keys(kid)  # same key name, another key: the signature cannot match
    scopes = [READ, WRITE]
    out: dict[str, tuple[str | None, int]] = {
        "no token": (None, 401),
        "garbage": ("not-a-jwt", 401),
        "bad signature": (mint(impostor, scopes, "orchestrator"), 401),
        "unknown key": (mint(ed_keys(), scopes, "orchestrator"), 401),
        "expired": (mint(keys, scopes, "orchestrator", ttl=60, now=now - 3600), 401),
        "not yet valid": (mint(keys, scopes, "orchestrator", ttl=7200, now=now + 3600), 401),
        "audience ingest": (mint(keys, scopes, "ingest"), 401),
        "audience worker": (mint(keys, scopes, "worker"), 401),
        "ingest scopes": (mint(keys, ["streams:write", "routing:write"], "orchestrator"), 403),
        "worker scope": (mint(keys, ["worker:*"], "orchestrator"), 403),
    }
    for name, token in forged_tokens(keys, tmp_path).items():
        out[name] = (token, 401)
    return out


async def test_every_route_but_healthz_has_a_scope(tmp_path: Path) -> None:
    for metrics_auth in (False, True):
        orch = Orchestrator(
            orch_settings(tmp_path, metrics_auth=metrics_auth),
            prober=StatusProber(20),
            ingest=NullIngestLink(),
        )
        try:
            scopes = route_scopes(create_app(orch))
        finally:
            await orch.aclose()
        want = dict(EXPECTED_SCOPES)
        if metrics_auth:
            want[("GET", "/metrics")] = "metrics:read"
        assert scopes == want  # no route unaudited; /docs and /openapi.json open
        open_routes = [*DOCS, ("GET", "/healthz")]
        open_routes += [] if metrics_auth else [("GET", "/metrics")]
        assert [k for k, v in scopes.items() if v is None] == open_routes


async def test_unauthenticated_post_pods_and_streams_are_refused_and_change_nothing(
    tmp_path: Path,
) -> None:
    async with api(tmp_path, ed_keys()) as (orch, url):
        before = await state_of(orch)
        async with httpx.AsyncClient(base_url=url) as http:
            pods = await http.post("/v1/pods", json={"tier": "ondemand"})
            streams = await http.post("/v1/streams", json={"id": "cam-9", "url": "rtsp://x/1"})
            health = await http.get("/healthz")
            broken = await http.post(
                "/v1/streams", content=b"{not json", headers={"content-type": "application/json"}
            )
        assert pods.status_code == 401 and streams.status_code == 401
        assert broken.status_code == 401  # the token first, then the body (never a 422)
        assert "Authorization" in pods.json()["detail"]
        assert pods.headers["www-authenticate"].startswith("Bearer")
        assert health.status_code == 200
        assert await state_of(orch) == before
        assert await orch.store.floors() == {} and await orch.store.streams() == {}


async def test_attack_matrix_every_route_refused_and_state_unchanged(tmp_path: Path) -> None:
    keys = ed_keys()

    async with api(tmp_path, keys, auth_max_failures=10_000) as (orch, url):
        await orch.store.put_stream(StreamSpec(id="cam-1", url="rtsp://cam/1"))
        before = await state_of(orch)
        async with httpx.AsyncClient(base_url=url) as http:
            for name, (token, want) in bad_tokens(keys, tmp_path).items():
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                for method, path, body in ROUTES:
                    resp = await http.request(method, path, json=body, headers=headers)
                    assert resp.status_code == want, (name, method, path, resp.text)
                    assert token is None or token not in resp.text
        assert await state_of(orch) == before
        refused = dict(orch.auth_refused)

    for reason in ("missing", "malformed", "bad_signature", "unknown_key", "expired",
                   "not_yet_valid", "wrong_audience", "scope"):  # fmt: skip
        assert refused.get(reason, 0) > 0, (reason, refused)


async def test_good_tokens_read_and_write(tmp_path: Path) -> None:
    keys = ed_keys()

    async with api(tmp_path, keys) as (orch, url):
        read = {"Authorization": f"Bearer {mint(keys, [READ], 'orchestrator')}"}
        write = {"Authorization": f"Bearer {mint(keys, ['fleet:*'], 'orchestrator')}"}
        async with httpx.AsyncClient(base_url=url) as http:
            body = {"id": "cam-2", "url": f"rtsp://admin:{PASSWORD}@cam/2?token={PASSWORD}"}
            assert (await http.post("/v1/streams", json=body, headers=read)).status_code == 403
            added = await http.post("/v1/streams", json=body, headers=write)
            assert added.status_code == 201, added.text
            listed = await http.get("/v1/streams", headers=read)
            fleet = await http.get("/v1/fleet", headers=read)
            pods = await http.post("/v1/pods", json={"tier": "ondemand"}, headers=write)
        assert listed.status_code == 200 and listed.json()[0]["id"] == "cam-2"
        assert pods.status_code == 202
        for text in (added.text, listed.text, fleet.text):
            assert PASSWORD not in text and "rtsp://***@cam/2?token=***" in text
        stored = (await orch.store.streams())["cam-2"]
        assert PASSWORD in stored.url  # the ingest still gets the real URL


@pytest.mark.parametrize(
    "body",
    [
        {"id": "bad id!", "url": f"rtsp://admin:{PASSWORD}@cam/1"},
        {"id": "cam-3", "url": f"rtsp://admin:{PASSWORD}@cam/1", "fps": -1},
        {"id": "cam-3", "url": f"rtsp://admin:{PASSWORD}@cam/1", "password": PASSWORD},
        {"id": "cam-3", "url": f"rtsp://admin:{PASSWORD}@cam/1", "priority": PASSWORD},
    ],
)
async def test_422_never_echoes_submitted_values(tmp_path: Path, body: dict[str, Any]) -> None:
    """The quoted bug: the orchestrator's 422 bodies echoed submitted values, a password too."""
    keys = ed_keys()

    async with api(tmp_path, keys) as (orch, url):
        write = {"Authorization": f"Bearer {mint(keys, [WRITE], 'orchestrator')}"}
        async with httpx.AsyncClient(base_url=url) as http:
            resp = await http.post("/v1/streams", json=body, headers=write)
        assert await orch.store.streams() == {}

    assert resp.status_code == 422
    assert PASSWORD not in resp.text and "admin" not in resp.text
    assert all({"type", "loc", "msg"} == set(e) for e in resp.json()["detail"])


async def test_failed_authentication_is_throttled_per_peer_and_counted(tmp_path: Path) -> None:
    keys = ed_keys()

    async with api(tmp_path, keys, auth_max_failures=3, auth_window_s=60) as (_orch, url):
        async with httpx.AsyncClient(base_url=url) as http:
            codes = [(await http.get("/v1/pods")).status_code for _ in range(4)]
            throttled = await http.get("/v1/pods")
            good = {"Authorization": f"Bearer {mint(keys, [READ], 'orchestrator')}"}
            served = (await http.get("/v1/pods", headers=good)).status_code  # never waits
            metrics = (await http.get("/metrics")).text
            health = (await http.get("/healthz")).status_code

    assert codes == [401, 401, 401, 429]
    assert throttled.status_code == 429 and int(throttled.headers["retry-after"]) >= 1
    assert served == 200 and health == 200
    assert 'framerelay_orch_auth_refused_total{reason="missing"} 3.0' in metrics
    assert 'framerelay_orch_auth_refused_total{reason="throttled"} 2.0' in metrics


async def test_metrics_behind_a_token_when_asked(tmp_path: Path) -> None:
    keys = ed_keys()

    async with api(tmp_path, keys, metrics_auth=True) as (_orch, url):
        async with httpx.AsyncClient(base_url=url) as http:
            out = [(await http.get("/metrics")).status_code]
            for scopes in ([READ], ["metrics:read"]):
                token = mint(keys, scopes, "orchestrator")
                resp = await http.get("/metrics", headers={"Authorization": f"Bearer {token}"})
                out.append(resp.status_code)

    assert out == [401, 403, 200]


async def test_single_host_shared_secret_works_for_the_api(tmp_path: Path, secret: str) -> None:
    settings = orch_settings(tmp_path, token_secrets=secret, signing_keys=None)
    orch = Orchestrator(settings, prober=StatusProber(20), ingest=NullIngestLink())
    try:
        async with serving_here(create_app(orch)) as url, httpx.AsyncClient() as http:
            auth = {"Authorization": f"Bearer {mint(secret, [READ], 'orchestrator')}"}
            resp = await http.get(f"{url}/v1/fleet", headers=auth)
    finally:
        await orch.store.clear()
        await orch.aclose()

    assert resp.status_code == 200


async def test_a_revoked_token_is_refused_without_a_restart(tmp_path: Path) -> None:
    """Issue 28: FRAMERELAY_REVOKED_TOKENS_FILE, read again when it changes."""
    keys = ed_keys()
    revoked = tmp_path / "revoked.txt"
    revoked.write_text("")
    token = mint(keys, [READ], "orchestrator", sub="ops-laptop")
    other = mint(keys, [READ], "orchestrator", sub="ops-desk")

    async with (
        api(tmp_path, keys, revoked_tokens_file=revoked) as (_orch, url),
        httpx.AsyncClient(base_url=url) as http,
    ):
        out = []
        for step in ("before", "after"):
            if step == "after":
                revoked.write_text("sub:ops-laptop\n")
                await asyncio.sleep(1.2)  # the file is looked at again at most once a second
            for tok in (token, other):
                resp = await http.get("/v1/fleet", headers={"Authorization": f"Bearer {tok}"})
                out.append((resp.status_code, resp.text if resp.status_code != 200 else ""))

    assert [code for code, _ in out] == [200, 200, 401, 200]
    assert "revoked" in out[2][1]
