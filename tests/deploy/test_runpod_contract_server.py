"""The RunPod v2 contract server follows RunPod's schema mechanically (issue 29).

Real HTTP on 127.0.0.1. Every test's server must end with no violation: each response it
sent validated against RunPod's schema (the ``runpod`` fixture checks).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.rig.runpod_schema import SCHEMA_PATH, RunPodSchema, validate_request, validate_response
from bench.rig.runpod_v2_contract import (
    NO_CAPACITY,
    ContractServer,
    Reply,
    running_runpod_v2,
)
from tests.conftest import MODEL, ROOT, TIMEOUT_FACTOR

KEY = "rpa_" + "V2c0ntr4ctK3y" * 3
SHARED = ROOT.parent / "shared" / "reference" / "runpod" / "openapi-v2.json"
A4000 = "NVIDIA RTX A4000"
L4 = "NVIDIA L4"


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Api:
    """A client of the contract server, as RunPod's API is called."""

    def __init__(self, server: ContractServer, base: str) -> None:
        self.server = server
        self.root = base.removesuffix("/v2")
        self.http = httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {KEY}"}, timeout=10 * TIMEOUT_FACTOR
        )

    def create(self, **over: Any) -> httpx.Response:
        body = {"name": "fr-pod-0", "image": "framerelay/worker:0.1.0", "gpu": {"id": A4000}}
        body.update(over)
        return self.http.post("/pods", json=body)

    def pod(self, pod_id: str) -> dict[str, Any]:
        resp = self.http.get(f"/pods/{pod_id}")
        assert resp.status_code == 200, resp.text
        got: dict[str, Any] = resp.json()
        return got

    def action(self, pod_id: str, action: str) -> httpx.Response:
        return self.http.post(f"/pods/{pod_id}/action", json={"action": action})


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def server(clock: Clock) -> ContractServer:
    return ContractServer(KEY, clock=clock)


@pytest.fixture
def api(server: ContractServer) -> Iterator[Api]:
    with running_runpod_v2(server) as base:
        client = Api(server, base)
        yield client
        client.http.close()
    assert server.violations == []  # every response it sent fitted RunPod's schema
    assert not server.key_in_url


def problem(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = resp.json()
    assert body["status"] == status and body["title"] and body["detail"]
    return body


# -- the reduced schema ----------------------------------------------------------------


def test_the_committed_schema_is_the_scripts_output(tmp_path: Path) -> None:
    if not SHARED.is_file():
        pytest.skip(f"RunPod's schema is not here ({SHARED}): nothing to compare with")
    out = tmp_path / "reduced.json"
    script = ROOT / "scripts" / "reduce_openapi.py"
    subprocess.run([sys.executable, str(script), str(SHARED), "--out", str(out)], check=True)
    assert out.read_bytes() == SCHEMA_PATH.read_bytes(), "rerun scripts/reduce_openapi.py"


def test_the_reduced_schema_keeps_structure_only() -> None:
    document = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    source = document["x-source"]
    assert "openapi-v2.json" in source and "scripts/reduce_openapi.py" in source
    assert "a900806e253c4f8c16da27d1a4370e72456da4cb" in source
    create = document["components"]["schemas"]["CreatePodRequest"]
    assert create["unevaluatedProperties"] is False and create["then"] == {"required": ["image"]}
    text = SCHEMA_PATH.read_text(encoding="utf-8")
    assert '"examples"' not in text and '"x-codeSamples"' not in text

    def strings_described(node: Any) -> int:
        if isinstance(node, dict):
            own = isinstance(node.get("description"), str)
            return own + sum(strings_described(v) for v in node.values())
        if isinstance(node, list):
            return sum(strings_described(v) for v in node)
        return 0

    assert strings_described(document) == 0


@pytest.mark.parametrize(
    ("method", "path", "template"),
    [
        ("GET", "/v2/pods/abc123", "/v2/pods/{id}"),
        ("POST", "/v2/pods/abc123/action", "/v2/pods/{id}/action"),
        ("GET", "/v2/registries/delegations", "/v2/registries/delegations"),
        ("DELETE", "/v2/registries/delegations/d1", "/v2/registries/delegations/{id}"),
        ("GET", "/v2/serverless/e1/workers/w1/logs", "/v2/serverless/{id}/workers/{workerId}/logs"),
        ("PUT", "/v2/pods/abc123", None),
        ("GET", "/v1/pods", None),
    ],
)
def test_paths_match_their_templates(method: str, path: str, template: str | None) -> None:
    assert RunPodSchema.load().template_of(method, path) == template


def test_the_validators_name_what_is_wrong() -> None:
    body = {"name": "p", "image": "i", "gpu": {"id": A4000}}
    assert validate_request("POST", "/v2/pods", body) == []
    (unknown,) = validate_request("POST", "/v2/pods", {**body, "gpuTypeIds": [A4000]})
    assert unknown.startswith("$: ") and "'gpuTypeIds'" in unknown
    # A failing `gpu` takes its branch's annotations with it, so JSON Schema also calls
    # `gpu` and `name` unevaluated at the top: both lines come back.
    nested = validate_request("POST", "/v2/pods", {**body, "gpu": {"id": A4000, "kind": 1}})
    assert any(e.startswith("$.gpu: ") and "'kind'" in e for e in nested), nested
    (image,) = validate_request("POST", "/v2/pods", {"name": "p", "gpu": {"id": A4000}})
    assert "'image' is a required property" in image
    (include,) = validate_request("GET", "/v2/catalog/gpus", None, {"include": ["SPOT"]})
    assert include.startswith("query.include[0]: ")
    assert validate_request("GET", "/v2/catalog/gpus", None, {"count": ["two"]}) != []
    assert validate_response("GET", "/v2/pods", 200, {"pods": []}) == []
    assert validate_response("GET", "/v2/pods", 200, {"items": []}) != []
    assert validate_response("GET", "/v2/pods", 201, {"pods": []}) != []  # not declared
    assert validate_response("DELETE", "/v2/pods/{id}", 204, None) == []
    error = {"title": "Bad Request", "status": 400, "detail": "no"}
    assert validate_response("GET", "/v2/pods", 400, error) == []  # `default` covers it


# -- requests refused as RunPod refuses them -------------------------------------------------


def test_a_create_with_an_unknown_field_is_refused_naming_it(api: Api) -> None:
    body = problem(api.create(bogus=1), 422)
    assert body["title"] == "Unprocessable Entity"
    assert any("'bogus'" in e for e in body["errors"]), body
    v1 = problem(api.create(gpuTypeIds=[A4000], cloudType="SECURE"), 422)
    assert any("'gpuTypeIds'" in e and "'cloudType'" in e for e in v1["errors"]), v1
    assert api.server.pods == {}
    assert len(api.server.client_errors) == 2


def test_a_create_without_a_name_is_refused_naming_it(api: Api) -> None:
    resp = api.http.post("/pods", json={"image": "img:1", "gpu": {"id": A4000}})
    body = problem(resp, 422)
    # The branch that declares `name` failed, so JSON Schema also reports `gpu` (declared
    # there) as unevaluated: the missing name comes first.
    assert body["errors"][0] == "$: 'name' is a required property", body
    assert api.server.pods == {}


def test_a_bad_key_is_401_and_the_key_is_not_echoed(api: Api) -> None:
    bad = httpx.get(f"{api.http.base_url}pods", headers={"Authorization": "Bearer rpa_wrong"})
    assert "rpa_wrong" not in problem(bad, 401)["detail"]
    assert problem(httpx.get(f"{api.http.base_url}pods"), 401)["detail"] == "missing bearer token"


def test_v1_paths_are_not_operations(api: Api) -> None:
    problem(api.http.get(f"{api.root}/v1/pods"), 404)
    problem(api.http.post("/pods/x/stop"), 404)
    assert len(api.server.client_errors) == 2


# -- the pod lifecycle ------------------------------------------------------------------------


def test_a_pod_provisions_starts_runs_stops_and_terminates(api: Api, clock: Clock) -> None:
    api.server.knobs.provision_s, api.server.knobs.start_s = 5.0, 5.0
    resp = api.create(ports=["8443/tcp", "8888/http"], gpu={"id": L4, "count": 2})
    assert resp.status_code == 201, resp.text
    pod = resp.json()
    assert pod["status"] == "PROVISIONING" and pod["runtime"] is None
    assert pod["actions"] == ["stop", "terminate"] and pod["cost"] == pytest.approx(0.86)
    clock.now += 5
    assert api.pod(pod["id"])["status"] == "STARTING"
    clock.now += 5
    running = api.pod(pod["id"])
    assert running["status"] == "RUNNING" and running["startedAt"] is not None
    (port,) = running["runtime"]["ports"]
    assert port["private"] == 8443 and port["type"] == "tcp" and port["ip"] == "127.0.0.1"
    assert isinstance(port["public"], int) and len(running["runtime"]["gpus"]) == 2
    problem(api.action(pod["id"], "start"), 409)
    stopped = api.action(pod["id"], "stop").json()
    assert stopped["status"] == "EXITED" and stopped["cost"] == 0.0
    assert stopped["runtime"] is None and stopped["actions"] == ["start", "terminate"]
    assert api.action(pod["id"], "start").json()["status"] == "STARTING"
    assert api.action(pod["id"], "terminate").status_code == 204
    problem(api.http.get(f"/pods/{pod['id']}"), 404)


def test_lists_are_wrapped_whole_and_undeclared_paging_is_noticed(api: Api) -> None:
    ids = {api.create(name=f"fr-pod-{i}").json()["id"] for i in range(3)}
    listed = api.http.get("/pods").json()
    assert set(listed) == {"pods"} and {p["id"] for p in listed["pods"]} == ids
    assert api.server.client_errors == []
    api.http.get("/pods", params={"limit": 2})  # RunPod's schema declares no paging
    assert api.server.client_errors == [
        "GET /v2/pods: query parameter 'limit' is not in RunPod's schema"
    ]


def test_a_template_supplies_the_image_and_env(api: Api) -> None:
    made = api.http.post(
        "/templates",
        json={
            "name": "framerelay-worker",
            "image": "framerelay/worker:0.1.0",
            "disk": 20,
            "ports": ["8443/tcp"],
            "env": {"A": "template", "B": "template"},
        },
    )
    assert made.status_code == 201, made.text
    body = {
        "name": "fr-pod-t",
        "templateId": made.json()["id"],
        "gpu": {"id": A4000},
        "env": {"B": "pod"},
    }
    pod = api.http.post("/pods", json=body).json()
    assert pod["image"] == "framerelay/worker:0.1.0" and pod["disk"] == 20
    assert pod["env"] == {"A": "template", "B": "pod"} and pod["template"] == made.json()["id"]
    missing = api.http.post("/pods", json={**body, "templateId": "nope"})
    problem(missing, 404)


def test_a_network_volume_places_its_pods(api: Api) -> None:
    volume = api.http.post(
        "/network-volumes", json={"name": "cache", "size": 20, "dataCenter": "EU-SE-1"}
    ).json()
    mounts = {"network": [{"volumeId": volume["id"], "path": "/cache"}]}
    placed = api.create(mounts=mounts).json()
    assert placed["dataCenterId"] == "EU-SE-1" and placed["mounts"] == mounts
    elsewhere = problem(api.create(mounts=mounts, dataCenterIds=["EU-RO-1"]), 400)
    assert "EU-SE-1" in elsewhere["detail"]
    assert api.http.get("/network-volumes").json() == {"networkVolumes": [volume]}
    problem(
        api.http.post("/network-volumes", json={"name": "c", "size": 5, "dataCenter": "EU-SE-1"}),
        422,
    )


# -- the awkward cases ---------------------------------------------------------------------


def test_no_stock_answers_400_and_the_catalog_shows_none(api: Api) -> None:
    api.server.knobs.no_stock = {(A4000, "*")}
    body = problem(api.create(), 400)
    assert body["detail"] == NO_CAPACITY and api.server.pods == {}
    assert api.create(gpu={"id": L4}).status_code == 201
    query = {"include": "AVAILABILITY", "product": "POD"}
    gpus = {g["id"]: g for g in api.http.get("/catalog/gpus", params=query).json()["gpus"]}
    assert gpus[A4000]["availability"] == "NONE" and "dataCenters" not in gpus[A4000]
    assert gpus[L4]["availability"] == "HIGH" and gpus[L4]["dataCenters"]
    assert gpus[L4]["price"] == {"secure": 0.43, "community": 0.30, "serverless": 0.69}
    problem(api.http.get("/catalog/gpus", params={"include": "AVAILABILITY"}), 400)
    problem(api.http.get("/catalog/gpus", params={"include": "AVAILABILITY,STOCK"}), 400)
    centres = api.http.get("/catalog/datacenters", params={"include": "GPU_AVAILABILITY"})
    ro = next(d for d in centres.json()["dataCenters"] if d["id"] == "EU-RO-1")
    assert {"id": A4000, "name": "RTX A4000", "availability": "NONE"} in ro["gpuAvailability"]


def test_a_500_after_create_leaves_the_pod(api: Api) -> None:
    api.server.knobs.fail_after_create = 1
    assert problem(api.create(), 500)["title"] == "Internal Server Error"
    (listed,) = api.http.get("/pods").json()["pods"]
    assert listed["name"] == "fr-pod-0"


def test_a_community_pod_without_a_public_port(api: Api) -> None:
    api.server.knobs.community_public_ip = False
    pod = api.create(cloud="COMMUNITY", ports=["8443/tcp"]).json()
    assert pod["cost"] == pytest.approx(0.20)
    running = api.pod(pod["id"])
    assert running["status"] == "RUNNING"
    assert running["runtime"]["ports"] == [
        {"private": 8443, "public": None, "type": "tcp", "ip": None}
    ]


def test_a_pod_that_fails_at_boot_says_why_in_its_log(api: Api) -> None:
    reason = "CUDA error: no CUDA-capable device is detected"
    api.server.knobs.boot_errors = [reason]
    pod = api.create().json()
    failed = api.pod(pod["id"])
    assert failed["status"] == "ERROR" and failed["actions"] == ["start", "terminate"]
    assert failed["runtime"] is None
    lines = read_log(api, pod["id"], reason)
    assert lines[-1] == {"source": "system", "line": reason}
    assert api.action(pod["id"], "start").json()["status"] == "STARTING"
    assert api.pod(pod["id"])["status"] == "RUNNING"  # the next boot works


def test_a_running_pod_that_dies_goes_to_error(api: Api) -> None:
    pod = api.create().json()
    assert api.pod(pod["id"])["status"] == "RUNNING"
    api.server.fail_pod(pod["id"], "container exited with code 137 (out of memory)")
    assert api.pod(pod["id"])["status"] == "ERROR"
    problem(api.action(pod["id"], "stop"), 409)


def test_rate_limits_and_500s_come_as_problems(api: Api) -> None:
    api.server.knobs.rate_limit_next, api.server.knobs.retry_after_s = 1, 2
    limited = api.http.get("/pods")
    assert problem(limited, 429) and limited.headers["retry-after"] == "2"
    api.server.knobs.fail_next = 1
    problem(api.http.get("/pods"), 500)
    assert api.http.get("/pods").status_code == 200


def test_a_response_that_breaks_the_schema_is_a_500_and_a_violation(
    server: ContractServer,
) -> None:
    server._handlers[("GET", "/v2/pods")] = lambda call: Reply(200, {"items": []})
    with running_runpod_v2(server) as base:
        resp = httpx.get(f"{base}/pods", headers={"Authorization": f"Bearer {KEY}"})
    body = problem(resp, 500)
    assert "contract server bug" in body["detail"] and body["errors"]
    assert server.violations == [f"GET /v2/pods -> 500: {body['errors'][0]}"]


# -- serverless endpoints --------------------------------------------------------------------


def test_serverless_endpoints_are_made_changed_and_deleted(api: Api) -> None:
    api.server.knobs.serverless_url = "http://127.0.0.1:9/v2"
    body = {
        "name": "fr-jobs",
        "image": "framerelay/worker:0.1.0",
        "type": "QUEUE",
        "gpu": {"pools": ["AMPERE_16"]},
        "workers": {"min": 0, "max": 2},
        "scaling": {"type": "QUEUE_DELAY", "queueDelay": 4},
    }
    problem(api.http.post("/serverless", json={**body, "idleTimeout": 5}), 422)
    problem(api.http.post("/serverless", json={**body, "gpu": {"pools": ["H100"]}}), 400)
    made = api.http.post("/serverless", json=body)
    assert made.status_code == 201, made.text
    endpoint = made.json()
    assert endpoint["requestUrls"]["run"] == f"http://127.0.0.1:9/v2/{endpoint['id']}/run"
    changed = api.http.patch(f"/serverless/{endpoint['id']}", json={"workers": {"max": 5}})
    assert changed.json()["workers"] == {"min": 0, "max": 5, "idleTimeout": 10}
    assert [e["id"] for e in api.http.get("/serverless").json()["endpoints"]] == [endpoint["id"]]
    assert api.http.delete(f"/serverless/{endpoint['id']}").status_code == 204
    problem(api.http.get(f"/serverless/{endpoint['id']}"), 404)


# -- a pod backed by a real worker process ------------------------------------------------------


@pytest.mark.integration
def test_a_launcher_backs_a_pod_with_a_real_worker(secret: str, clock: Clock) -> None:
    from framerelay.launcher import LocalWorker

    stopped: list[str] = []

    def launch(pod: dict[str, Any]) -> tuple[str, int, Any]:
        worker = LocalWorker(
            secret,
            worker_id=pod["name"],
            env=pod["env"],
            args=["--model", str(MODEL), "--threads", "1", "--host", "127.0.0.1"],
        )
        worker.start(120 * TIMEOUT_FACTOR)

        def stop() -> None:
            stopped.append(pod["id"])
            worker.stop()

        return "127.0.0.1", int(worker.url.rsplit(":", 1)[1].split("/")[0]), stop

    server = ContractServer(KEY, launcher=launch, clock=clock)
    with running_runpod_v2(server) as base:
        api = Api(server, base)
        try:
            pod = api.create(ports=["8443/tcp"]).json()
            running = wait_status(api, pod["id"], "RUNNING", 120 * TIMEOUT_FACTOR)
            (port,) = running["runtime"]["ports"]
            health = httpx.get(f"http://{port['ip']}:{port['public']}/healthz", timeout=10)
            assert health.status_code == 200
            assert api.action(pod["id"], "terminate").status_code == 204
            assert stopped == [pod["id"]]
        finally:
            api.http.close()
    assert server.violations == []


def wait_status(api: Api, pod_id: str, status: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        pod = api.pod(pod_id)
        if pod["status"] == status or time.monotonic() > deadline:
            assert pod["status"] == status, pod
            return pod
        time.sleep(0.1)


def read_log(api: Api, pod_id: str, until: str) -> list[dict[str, str]]:
    """The pod's log events up to the line ``until`` (the stream stays open)."""
    lines: list[dict[str, str]] = []
    params = {"source": "system"}
    with api.http.stream("GET", f"/pods/{pod_id}/logs", params=params) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith(
            "text/event-stream"
        )
        for text in resp.iter_lines():
            if text.startswith("data: "):
                event = json.loads(text.removeprefix("data: "))
                lines.append({"source": event["source"], "line": event["line"]})
                if event["line"] == until:
                    return lines
    raise AssertionError(f"the log stream ended before {until!r}: {lines}")
