"""Issue 13: the OpenAPI documents are complete and ``/docs`` works offline.

Every operation of the ingest API (the results WebSocket included) and of the
orchestrator API has a summary, a description, its security requirement (the
HTTP bearer JWT scheme, or an explicit ``[]`` when open), the refusals of a
scoped route (401/403/429), 413 and 422 where a body or parameters are read,
its own errors (404/409/503), each with the body it really answers. Then real
Chromium (Debian's ``chromium`` + ``chromium-driver``) renders ``/docs``
(Swagger UI) and ``/redoc`` of a real server with every host but 127.0.0.1
unresolvable, and no request leaves 127.0.0.1.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from deploy.api import create_app as orch_app
from deploy.health import StatusProber
from deploy.ingest_link import NullIngestLink
from deploy.service import Orchestrator
from framerelay.openapi_docs import ASSETS
from ingest.app import create_app as ingest_app
from ingest.service import IngestService
from ingest.store import FileStore
from tests.support.auth import ed_keys
from tests.support.browser import chromium, requested_urls
from tests.support.ingest_api import running_ingest, settings_for
from tests.support.orchestrator import orch_settings, serving_here

pytestmark = pytest.mark.integration
REFUSALS = {"401", "403", "429"}
OWN_ERRORS = {  # (service, method, path) -> the route's own error codes
    ("ingest", "POST", "/v1/streams"): {"409", "503"},
    ("ingest", "GET", "/v1/streams/{stream_id}"): {"404"},
    ("ingest", "PUT", "/v1/streams/{stream_id}"): {"404", "503"},
    ("ingest", "DELETE", "/v1/streams/{stream_id}"): {"404", "503"},
    ("ingest", "PUT", "/v1/streams/{stream_id}/worker"): {"404"},
    ("ingest", "DELETE", "/v1/streams/{stream_id}/worker"): {"404"},
    ("ingest", "GET", "/v1/history"): {"404"},
    ("ingest", "GET", "/v1/console/streams"): {"503"},
    ("ingest", "GET", "/v1/console/streams/{stream_id}/live"): {"404", "503"},
    ("ingest", "GET", "/readyz"): {"503"},
    ("ingest", "GET", "/v1/results"): {"400", "503"},
    ("orchestrator", "POST", "/v1/pods"): {"404"},
    ("orchestrator", "DELETE", "/v1/pods/{name}"): {"404"},
    ("orchestrator", "POST", "/v1/streams"): {"409"},
    ("orchestrator", "DELETE", "/v1/streams/{stream_id}"): {"404"},
    ("orchestrator", "POST", "/v1/streams/{stream_id}/move"): {"404", "409"},
}
OPEN = {"/healthz", "/readyz", "/metrics"}


def ingest_spec(tmp_path: Path) -> dict[str, Any]:
    settings = settings_for(ed_keys(), tmp_path)
    service = IngestService(settings, store=FileStore(settings.store_path))
    return ingest_app(service).openapi()


async def orch_spec(tmp_path: Path) -> dict[str, Any]:
    orch = Orchestrator(
        orch_settings(tmp_path, ed_keys()), prober=StatusProber(20), ingest=NullIngestLink()
    )
    try:
        return orch_app(orch).openapi()
    finally:
        await orch.aclose()


def operations(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in spec["paths"].items():
        for method, op in item.items():
            yield method.upper(), path, op


def _schema_of(response: dict[str, Any]) -> str:
    return str(response["content"]["application/json"]["schema"]["$ref"]).rsplit("/", 1)[-1]


def check_operation(service: str, method: str, path: str, op: dict[str, Any]) -> None:
    where = f"{service} {method} {path}"
    assert op.get("summary") and op.get("description"), where
    assert "security" in op, where
    codes = set(op["responses"])
    if op["security"]:
        ((scheme, scopes),) = op["security"][0].items()
        assert scheme == "bearerAuth" and len(scopes) == 1, where
        assert REFUSALS <= codes, where
    else:
        assert path in OPEN, f"{where} is open"
    if "requestBody" in op:
        assert {"413", "422"} <= codes, where
    if op.get("parameters") and path != "/v1/results":
        assert _schema_of(op["responses"]["422"]) == "ValidationErrorBody", where
    own = OWN_ERRORS.get((service, method, path), set())
    assert own <= codes, f"{where}: {sorted(own - codes)} undocumented"
    for code in codes - {"422"}:
        if int(code) >= 400 and "content" in op["responses"][code]:
            body = _schema_of(op["responses"][code])
            assert body in {"ErrorBody", "ErrorMessage"}, f"{where} {code}: {body}"


def test_every_ingest_operation_is_documented(tmp_path: Path) -> None:
    spec = ingest_spec(tmp_path)
    ops = list(operations(spec))
    assert {p for _, p, _ in ops} >= {"/v1/streams", "/v1/results", "/v1/routing", "/v1/workers"}
    for method, path, op in ops:
        check_operation("ingest", method, path, op)
    scheme = spec["components"]["securitySchemes"]["bearerAuth"]
    assert (scheme["type"], scheme["scheme"], scheme["bearerFormat"]) == ("http", "bearer", "JWT")
    for scope in ("streams:read", "streams:write", "routing:write", "results:*", "metrics:read"):
        assert scope in scheme["description"], scope
    ws = spec["paths"]["/v1/results"]["get"]
    assert "101" in ws["responses"] and ws["security"] == [{"bearerAuth": ["results:<stream id>"]}]
    assert {p["name"] for p in ws["parameters"]} == {"stream", "class", "min_confidence", "resume"}


async def test_every_orchestrator_operation_is_documented(tmp_path: Path) -> None:
    spec = await orch_spec(tmp_path)
    ops = list(operations(spec))
    assert len(ops) == 16  # 12 + the 4 job routes
    for method, path, op in ops:
        check_operation("orchestrator", method, path, op)
    description = spec["components"]["securitySchemes"]["bearerAuth"]["description"]
    scopes = ("fleet:read", "fleet:write", "metrics:read", "jobs:read", "jobs:write")
    assert all(s in description for s in scopes)


async def test_documented_error_bodies_are_what_the_api_answers(tmp_path: Path) -> None:
    """The 401, 404, 409 and 422 bodies of a real ingest match the models documented."""

    async with running_ingest(ed_keys(), tmp_path) as ingest:
        async with httpx.AsyncClient(base_url=ingest.base) as http:
            refused = await http.get("/v1/streams")
            missing = await http.get("/v1/streams/nope", headers=ingest.auth())
            bad = await http.post("/v1/streams", json={"id": "x"}, headers=ingest.auth())
        assert refused.status_code == 401 and set(refused.json()) == {"detail"}
        assert missing.status_code == 404 and isinstance(missing.json()["detail"], str)
        assert bad.status_code == 422
        assert {k for issue in bad.json()["detail"] for k in issue} == {"type", "loc", "msg"}


async def test_docs_and_assets_are_served_open(tmp_path: Path) -> None:
    async with running_ingest(ed_keys(), tmp_path) as ingest:
        async with httpx.AsyncClient(base_url=ingest.base) as http:
            for path in ("/openapi.json", "/docs", "/redoc"):
                r = await http.get(path)
                assert r.status_code == 200, path
                if path != "/openapi.json":  # the pages name no other host
                    assert "https://" not in r.text and "http://" not in r.text, path
                    assert "default-src 'self'" in r.headers["content-security-policy"]
            for name in ASSETS:
                r = await http.get(f"/docs/assets/{name}")
                assert r.status_code == 200 and len(r.content) > 100_000, name
            assert (await http.get("/docs/assets/..%2Fopenapi_docs.py")).status_code == 404


# --- real Chromium, offline -------------------------------------------------------------


def render(base: str, spec_paths: set[str]) -> tuple[set[str], str, list[str]]:
    """Swagger UI's operation paths, ReDoc's menu text, and every URL requested."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with chromium() as driver:
        driver.get(base + "/docs")
        wait = WebDriverWait(driver, 30)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".opblock")) >= len(spec_paths))
        shown = {e.get_attribute("data-path") for e in
                 driver.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")}  # fmt: skip
        driver.get(base + "/redoc")
        wait.until(lambda d: "List streams" in d.find_element(By.TAG_NAME, "body").text)
        menu = driver.find_element(By.TAG_NAME, "body").text
        return shown, menu, requested_urls(driver)


def _offline(urls: list[str], base: str) -> None:
    host = urlsplit(base).netloc
    outside = [u for u in urls if not u.startswith(("data:", "blob:"))
               and urlsplit(u).netloc != host]  # fmt: skip
    assert not outside, outside


async def test_ingest_docs_render_offline_in_chromium(tmp_path: Path) -> None:
    async with running_ingest(ed_keys(), tmp_path) as ingest:
        spec = (await asyncio.to_thread(httpx.get, ingest.base + "/openapi.json")).json()
        shown, menu, urls = await asyncio.to_thread(render, ingest.base, set(spec["paths"]))
        assert set(spec["paths"]) <= shown
        for summary in ("Add a stream", "Results WebSocket (upgrade)", "List worker tunnels"):
            assert summary in menu, summary
        _offline(urls, ingest.base)
        assert any(u.endswith("/docs/assets/swagger-ui-bundle.js") for u in urls)


@asynccontextmanager
async def orchestrator(tmp_path: Path) -> AsyncIterator[str]:
    orch = Orchestrator(orch_settings(tmp_path, ed_keys()), prober=StatusProber(20),
                        ingest=NullIngestLink())  # fmt: skip
    try:
        async with serving_here(orch_app(orch)) as url:
            yield url
    finally:
        await orch.store.clear()
        await orch.aclose()


async def test_orchestrator_docs_render_offline_in_chromium(tmp_path: Path) -> None:
    async with orchestrator(tmp_path) as url:
        spec = (await asyncio.to_thread(httpx.get, url + "/openapi.json")).json()
        shown, _menu, urls = await asyncio.to_thread(render, url, set(spec["paths"]))
        assert set(spec["paths"]) <= shown
        _offline(urls, url)
