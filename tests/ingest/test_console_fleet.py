"""Issue 15: the console's fleet panel (GET /v1/console/fleet) of a real ingest API reading a
real orchestrator API on loopback: the real fleet logic against the RunPod API v2 contract
server and a real Redis (fake clock), pods, cost and events after pods are created and lost;
one upstream call per 2 s for any number of consoles; an orchestrator that is not
configured, unreachable, silent, refusing the token or behind TLS; the route's own auth;
the settings' one-line errors."""

from __future__ import annotations

import asyncio
import datetime as dt
import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from bench.rig.runpod_v2_contract import ContractServer
from deploy.api import create_app as orch_app
from deploy.api import fleet_status
from deploy.clock import FakeClock
from framerelay.errors import ConfigError
from framerelay.settings import describe_invalid
from ingest.app import create_app
from ingest.console_fleet import REFRESH_S
from ingest.service import IngestService
from ingest.settings import IngestSettings
from ingest.store import FileStore
from tests.support.auth import ed_keys, mint
from tests.support.console import counted, plain_orchestrator, served_on
from tests.support.contract_fleet import (
    CANARY_MS,
    GPU,
    WARM_TIERS,
    TimedProber,
    community_pods,
    fleet_on_contract,
    passes,
    stream_spec,
)
from tests.support.ingest_api import client, make_pki, running_ingest, settings_for
from tests.support.orchestrator import serving_here
from tests.support.servers import free_port

pytestmark = pytest.mark.integration
PANEL = "/v1/console/fleet"
AFTER_REFRESH_S = REFRESH_S + 0.2


async def panel(http: httpx.AsyncClient, headers: dict[str, str]) -> dict[str, Any]:
    resp = await http.get(PANEL, headers=headers)
    assert resp.status_code == 200, resp.text
    assert resp.headers["cache-control"] == "no-store"
    body: dict[str, Any] = resp.json()
    return body


async def test_pods_cost_and_events_of_a_fleet_with_a_lost_community_pod(tmp_path: Path) -> None:
    clock = FakeClock(dt.datetime(2026, 3, 2, 12, tzinfo=dt.UTC))
    state = ContractServer("rpa_" + secrets.token_hex(12), clock=clock.now)
    async with fleet_on_contract(state, clock, WARM_TIERS) as orch:
        orch.fleet.prober = TimedProber()
        for i in range(9):  # 3 per worker: the warm on-demand one, 2 community
            await orch.store.put_stream(stream_spec(f"std-{i}"))
        await passes(orch, clock, 6)  # the history's point at 10 s sees them all placed
        app = orch_app(orch)
        async with (
            serving_here(app) as url,
            running_ingest(orch.keys, tmp_path, orchestrator_url=url) as ingest,
            client(ingest) as http,
        ):
            first = await panel(http, ingest.auth("streams:read"))
            expected = await fleet_status(orch)
            _check_first(first, expected, url)
            lost = community_pods(state)[0]
            state.vanish(lost)  # its host is lost
            await passes(orch, clock, 4)
            await asyncio.sleep(AFTER_REFRESH_S)
            second = await panel(http, ingest.auth("streams:read"))
    vanished = [e for e in second["events"] if e["kind"] == "vanished"]
    assert len(vanished) == 1 and "gone from the provider" in vanished[0]["reason"]
    gone = vanished[0]["pod"]
    assert gone in {p["name"] for p in first["pods"]}
    assert gone not in {p["name"] for p in second["pods"]}
    rehomed = [e for e in second["events"] if e["kind"] == "moved" and gone in e["reason"]]
    assert len(rehomed) == 3 and all(e["stream"] for e in rehomed)
    times = [e["t"] for e in second["events"]]
    assert times == sorted(times) and len(second["events"]) <= 50
    keys = [(e["t"], e["kind"], e["pod"], e["stream"]) for e in second["events"]]
    assert len(keys) == len(set(keys)), "an event shown twice"
    assert second["fetched_at"] > first["fetched_at"] and not second["stale"]


def _check_first(body: dict[str, Any], expected: dict[str, Any], url: str) -> None:
    assert body["configured"] and body["orchestrator"] == url and body["error"] is None
    assert body["provider"] == "runpod" and not body["stale"] and body["age_s"] < 2
    pods = {p["name"]: p for p in body["pods"]}
    assert set(pods) == {p["name"] for p in expected["pods"]} and len(pods) == 3
    for want in expected["pods"]:
        got = pods[want["name"]]
        assert (got["tier"], got["spot"], got["gpu"], got["state"], got["ready"]) == (
            want["tier"], want["spot"], GPU, "running", True)  # fmt: skip
        assert got["provider"] == "runpod" and got["canary_ms"] == CANARY_MS
        assert got["usd_per_hr"] == pytest.approx(want["cost_per_hr"], abs=1e-4)
        assert got["usd_per_hr"] > 0
        assert got["uptime_s"] == want["uptime_s"] > 0 and len(got["streams"]) == 3
    cost = body["cost"]
    burn = expected["cost"]["burn_usd_per_hr"]
    ondemand = sum(max(p["ondemand_per_hr"], p["cost_per_hr"]) for p in expected["pods"])
    assert cost["usd_per_hr"] == pytest.approx(burn, abs=1e-4)
    assert cost["ondemand_usd_per_hr"] == pytest.approx(ondemand, abs=1e-4)
    assert ondemand > burn > 0  # the community cloud saves
    assert cost["savings_usd_per_hr"] == pytest.approx(ondemand - burn, abs=1e-3)
    assert cost["savings_pct"] == pytest.approx(100 * (ondemand - burn) / ondemand, abs=0.01)
    assert cost["streams_placed"] == 9
    assert cost["usd_per_stream_hr"] == pytest.approx(burn / 9, abs=1e-4)
    assert 0 < cost["total_savings_pct"] < 100 and cost["total_usd"] > 0
    created = [e for e in body["events"] if e["kind"] == "created"]
    assert len(created) == 3 and all(e["reason"].startswith("tier ") for e in created)
    assert set(body["events"][0]) == {"t", "kind", "pod", "stream", "reason"}
    chart = body["history"]
    assert chart["interval_s"] == 10 and len(chart["t"]) == len(chart["usd_per_hr"]) >= 1
    assert chart["usd_per_hr"][-1] == pytest.approx(burn, abs=1e-4)
    assert chart["usd_per_stream_hr"][-1] == pytest.approx(burn / 9, abs=1e-3)
    assert len(chart["ondemand_usd_per_hr"]) == len(chart["t"])


async def test_one_upstream_call_per_refresh_whatever_the_number_of_consoles(
    tmp_path: Path,
) -> None:
    keys = ed_keys()
    async with plain_orchestrator(tmp_path, keys) as orch:
        app = orch_app(orch)
        calls = counted(app)
        async with (
            serving_here(app) as url,
            running_ingest(keys, tmp_path, orchestrator_url=url) as ingest,
            client(ingest) as http,
        ):
            read = ingest.auth("streams:read")
            bodies = await asyncio.gather(*(panel(http, read) for _ in range(20)))
            assert all(b["error"] is None for b in bodies), bodies[0]
            assert calls == {"/v1/fleet": 1, "/v1/events": 1, "/v1/history": 1}, calls
            await asyncio.gather(*(panel(http, read) for _ in range(10)))
            assert calls["/v1/fleet"] == 1, calls
            await asyncio.sleep(AFTER_REFRESH_S)
            await asyncio.gather(*(panel(http, read) for _ in range(10)))
    # history gains a point every 10 s: asked again only then
    assert calls == {"/v1/fleet": 2, "/v1/events": 2, "/v1/history": 1}, calls
    assert len({b["fetched_at"] for b in bodies}) == 1


async def test_not_configured_answers_so_and_the_route_needs_streams_read(tmp_path: Path) -> None:
    async with running_ingest(ed_keys(), tmp_path) as ingest, client(ingest) as http:
        assert await panel(http, ingest.auth("streams:read")) == {"configured": False}
        missing = await http.get(PANEL)
        wrong = await http.get(PANEL, headers=ingest.auth("results:*", "metrics:read"))
        other = await http.get(PANEL, headers=ingest.auth("streams:read", aud="orchestrator"))
    assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer")
    assert wrong.status_code == 403 and "streams:read" in wrong.text
    assert other.status_code == 401


async def test_an_unreachable_orchestrator_keeps_the_last_answer_marked_stale(
    tmp_path: Path,
) -> None:
    keys = ed_keys()
    async with plain_orchestrator(tmp_path, keys) as orch:
        orch.fleet.event("created", "fr-ondemand-0-g0", "tier ondemand needs 1 pod")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        async with running_ingest(keys, tmp_path, orchestrator_url=url) as ingest:
            async with client(ingest) as http:
                read = ingest.auth("streams:read")
                never = await panel(http, read)  # nobody listens yet
                await asyncio.sleep(AFTER_REFRESH_S)
                async with served_on(orch_app(orch), port):
                    good = await panel(http, read)
                await asyncio.sleep(AFTER_REFRESH_S)
                stale = await panel(http, read)
    assert never["configured"] and never["pods"] == [] and never["cost"] is None
    assert never["fetched_at"] is None and not never["stale"]
    assert never["error"] == "the orchestrator is unreachable: ConnectError"
    assert good["error"] is None and [e["kind"] for e in good["events"]] == ["created"]
    assert stale["stale"] and stale["error"] == "the orchestrator is unreachable: ConnectError"
    assert stale["fetched_at"] == good["fetched_at"] and stale["age_s"] >= REFRESH_S
    for kept in ("events", "cost", "history", "provider", "pods"):
        assert stale[kept] == good[kept], kept


async def test_a_silent_orchestrator_times_out(tmp_path: Path) -> None:
    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)  # the request
        await reader.read()  # until the ingest gives up and closes
        writer.close()

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with (
        server,
        running_ingest(
            ed_keys(), tmp_path, orchestrator_url=url, orchestrator_timeout_s=0.5
        ) as ingest,
    ):
        async with client(ingest) as http:
            body = await panel(http, ingest.auth("streams:read"))
        server.close()
    assert body["error"] == "the orchestrator did not answer GET /v1/fleet in time (timeout)"
    assert body["pods"] == [] and not body["stale"]


@pytest.mark.parametrize(
    ("scopes", "other_keys", "says"),
    [
        (("fleet:read",), True, ("HTTP 401", "FRAMERELAY_INGEST_ORCHESTRATOR_TOKEN")),
        (("fleet:write",), False, ("HTTP 403", "fleet:read")),
    ],
)
async def test_a_refused_token_shows_the_orchestrators_reason_not_the_token(
    tmp_path: Path, scopes: tuple[str, ...], other_keys: bool, says: tuple[str, ...]
) -> None:
    keys = ed_keys()
    token = mint(ed_keys() if other_keys else keys, scopes, "orchestrator")
    async with plain_orchestrator(tmp_path, keys) as orch:
        async with (
            serving_here(orch_app(orch)) as url,
            running_ingest(
                keys, tmp_path, orchestrator_url=url, orchestrator_token=token
            ) as ingest,
            client(ingest) as http,
            httpx.AsyncClient(base_url=url) as direct,
        ):
            resp = await http.get(PANEL, headers=ingest.auth("streams:read"))
            reason = (
                await direct.get("/v1/fleet", headers={"Authorization": f"Bearer {token}"})
            ).json()["detail"]
    text = resp.text
    error = httpx.Response(200, text=text).json()["error"]
    for word in (*says, reason):
        assert word in error, (word, error)
    assert token not in text and token.split(".")[2] not in text


async def test_an_https_orchestrator_is_verified_with_the_ca_file(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")

    keys = ed_keys()
    tls = {"ssl_certfile": str(pki.cert), "ssl_keyfile": str(pki.key)}
    bodies = []
    async with plain_orchestrator(tmp_path, keys) as orch:
        async with serving_here(orch_app(orch), **tls) as url:
            for ca in (pki.ca, pki.other_ca):
                async with (
                    running_ingest(
                        keys, tmp_path, orchestrator_url=url, orchestrator_ca=ca
                    ) as ingest,
                    client(ingest) as http,
                ):
                    bodies.append(await panel(http, ingest.auth("streams:read")))
    good, wrong = bodies
    assert good["error"] is None and good["orchestrator"].startswith("https://")
    assert "TLS verification failed" in wrong["error"] and wrong["fetched_at"] is None


SECRET = "pw-" + "s3cr3t-value"
BAD_SETTINGS = [
    ({"orchestrator_url": "http://10.1.2.3:8090"}, ("FRAMERELAY_INGEST_ORCHESTRATOR_URL",
                                                    "plain http://", "'10.1.2.3'", "https://")),
    ({"orchestrator_url": "ftp://orch:8090"}, ("ORCHESTRATOR_URL", "https://host")),
    ({"orchestrator_url": "https://orch"}, ("ORCHESTRATOR_URL", "needs credentials",
                                            "ORCHESTRATOR_TOKEN", "SIGNING_KEYS")),
    ({"orchestrator_url": f"https://ops:{SECRET}@orch:8090"}, ("must not hold credentials",)),
    ({"orchestrator_url": "https://orch:99999"}, ("not a valid URL",)),
    ({"orchestrator_url": "https://orch\n.evil"}, ("control character",)),
    ({"orchestrator_token": SECRET}, ("need FRAMERELAY_INGEST_ORCHESTRATOR_URL",)),
    ({"orchestrator_url": "http://127.0.0.1:8090", "orchestrator_ca": "ca.pem",
      "orchestrator_token": SECRET}, ("ORCHESTRATOR_CA needs an https://",)),
]  # fmt: skip


@pytest.mark.parametrize(("values", "says"), BAD_SETTINGS)
def test_bad_orchestrator_settings_are_one_line_without_secrets(
    values: dict[str, Any], says: tuple[str, ...]
) -> None:
    with pytest.raises(ValidationError) as info:
        IngestSettings(**values)
    line = describe_invalid(info.value)
    assert "\n" not in line and SECRET not in line, line
    for word in says:
        assert word in line, (word, line)


def test_loopback_http_and_minted_tokens_are_fine_and_unusable_keys_are_refused(
    tmp_path: Path,
) -> None:
    keys = ed_keys()
    ok = settings_for(keys, tmp_path, orchestrator_url="http://localhost:8090/")
    assert ok.orchestrator_url == "http://localhost:8090"
    create_app(IngestService(ok, store=FileStore(ok.store_path)))  # mints with the private keys
    public = settings_for(keys.public(), tmp_path, token="a-fixed-tunnel-token",
                          orchestrator_url="https://orch.internal")  # fmt: skip
    with pytest.raises(ConfigError, match="FRAMERELAY_INGEST_ORCHESTRATOR_TOKEN"):
        create_app(IngestService(public, store=FileStore(public.store_path)))
    missing_ca = settings_for(keys, tmp_path, orchestrator_url="https://orch.internal",
                              orchestrator_ca=tmp_path / "none.pem")  # fmt: skip
    with pytest.raises(ConfigError, match="cannot load the CA file for the orchestrator"):
        create_app(IngestService(missing_ca, store=FileStore(missing_ca.store_path)))
