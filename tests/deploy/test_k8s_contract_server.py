"""The contract Kubernetes API server (tests/support/k8s_api, issue 31 Build point 6)
follows the documented API: driven with raw HTTP and with lightkube's AsyncClient.

Real HTTP on 127.0.0.1. Every test's server ends with no violation (each object it
received and sent fitted the Kubernetes schemas); tests that send bad objects on
purpose take theirs out first.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import TIMEOUT_FACTOR
from tests.support.k8s_api import GPU_TAINT, K8sContractServer, NodeSpec

NS = "framerelay"
PODS = f"/api/v1/namespaces/{NS}/pods"
APPLY = {"Content-Type": "application/apply-patch+yaml"}
GPU_NODE = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "1"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
WAIT_S = 20 * TIMEOUT_FACTOR
KEY_PEM = (
    "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n"
    "-----END PRIVATE KEY-----\n"
)


def nodes() -> list[NodeSpec]:
    return [
        NodeSpec("cpu-a"),
        NodeSpec("gpu-a", {"pool": "gpu"}, (GPU_TAINT,), dict(GPU_NODE)),
        NodeSpec("gpu-b", {"pool": "gpu"}, (GPU_TAINT,), dict(GPU_NODE)),
    ]


def pod(
    name: str,
    *,
    gpus: int = 1,
    tolerate: bool = True,
    image: str = "framerelay/worker:0.1.0",
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "worker",
        "image": image,
        "args": ["worker"],
        "ports": [{"containerPort": 8443 + k, "name": f"tunnel-{k}"} for k in range(gpus)],
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"cpu": "1"}},
    }
    body: dict[str, Any] = {"containers": [container], **spec}
    if tolerate:
        body["tolerations"] = [GPU_TOLERATION]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "framerelay-worker"}},
        "spec": body,
    }


class Api:
    """Raw HTTP, as the API conventions describe it."""

    def __init__(self, server: K8sContractServer) -> None:
        self.server = server
        self.http = httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=WAIT_S
        )

    def apply(
        self, path: str, obj: dict[str, Any], manager: str = "framerelay", force: bool = True
    ) -> httpx.Response:
        params = {"fieldManager": manager, **({"force": "true"} if force else {})}
        return self.http.patch(
            f"{path}/{obj['metadata']['name']}",
            params=params,
            content=json.dumps(obj),
            headers=APPLY,
        )

    def watch(self, path: str, **params: str) -> list[dict[str, Any]]:
        """A watch's events until its ``timeoutSeconds``."""
        with self.http.stream("GET", path, params={"watch": "true", **params}) as resp:
            assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
            return [json.loads(line) for line in resp.iter_lines() if line]


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what}")


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    assert obj is not None
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def status_of(resp: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    assert resp.status_code == code, resp.text
    assert resp.headers["content-type"] == "application/json"
    body: dict[str, Any] = resp.json()
    assert (body["kind"], body["status"], body["code"], body["reason"]) == (
        "Status",
        "Failure",
        code,
        reason,
    )
    return body


@pytest.fixture
def k8s() -> Iterator[K8sContractServer]:
    with K8sContractServer(nodes=nodes()) as server:
        yield server
        assert server.violations() == []
        assert server.client_errors == []


@pytest.fixture
def api(k8s: K8sContractServer) -> Iterator[Api]:
    client = Api(k8s)
    yield client
    client.http.close()


# -- the API's conventions ---------------------------------------------------------------


def test_a_request_without_the_bearer_token_gets_401_as_a_status(k8s: K8sContractServer) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        status_of(httpx.get(f"{k8s.url}{PODS}", headers=headers), 401, "Unauthorized")


def test_version_and_discovery(api: Api) -> None:
    assert api.http.get("/version").json()["gitVersion"] == "v1.32.0"
    assert api.http.get("/api").json()["versions"] == ["v1"]
    groups = {g["name"] for g in api.http.get("/apis").json()["groups"]}
    assert {"networking.k8s.io", "policy", "apps"} <= groups


def test_apply_creates_then_updates_under_its_field_manager_without_last_applied(api: Api) -> None:
    made = api.apply(PODS, pod("w-0"))
    assert made.status_code == 201, made.text
    meta = made.json()["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and int(meta["resourceVersion"]) > 0
    assert [(m["manager"], m["operation"]) for m in meta["managedFields"]] == [
        ("framerelay", "Apply")
    ]
    again = api.apply(PODS, pod("w-0"))
    assert again.status_code == 200 and again.json()["metadata"]["uid"] == meta["uid"]
    svc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "s", "labels": {"a": "1"}},
        "spec": {"selector": {"a": "1"}, "ports": [{"port": 8443}]},
    }
    assert api.apply(f"/api/v1/namespaces/{NS}/services", svc).status_code == 201
    svc["metadata"]["labels"] = {"a": "2"}
    changed = api.apply(f"/api/v1/namespaces/{NS}/services", svc).json()
    assert changed["metadata"]["labels"] == {"a": "2"} and changed["spec"]["clusterIP"]
    for kind in ("Pod", "Service"):
        for obj in api.server.objects(kind):
            assert "kubectl.kubernetes.io/last-applied-configuration" not in obj["metadata"].get(
                "annotations", {}
            )


def test_apply_needs_a_field_manager_and_a_second_manager_conflicts_unless_forced(api: Api) -> None:
    path = f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets"
    pdb: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "warm"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "w"}}},
    }
    no_manager = api.http.patch(f"{path}/warm", content=json.dumps(pdb), headers=APPLY)
    status_of(no_manager, 400, "BadRequest")
    assert api.apply(path, pdb, manager="framerelay").status_code == 201
    pdb["spec"]["minAvailable"] = 2
    conflict = status_of(api.apply(path, pdb, manager="someone-else", force=False), 409, "Conflict")
    assert conflict["details"]["causes"][0]["field"] == ".spec.minAvailable"
    assert '"framerelay"' in conflict["message"]
    assert (
        api.apply(path, pdb, manager="someone-else", force=True).json()["spec"]["minAvailable"] == 2
    )


def test_errors_are_status_objects(api: Api) -> None:
    status_of(api.http.get(f"{PODS}/nope"), 404, "NotFound")
    status_of(api.http.delete(f"{PODS}/nope"), 404, "NotFound")
    assert api.http.post(PODS, json=pod("twice")).status_code == 201
    body = status_of(api.http.post(PODS, json=pod("twice")), 409, "AlreadyExists")
    assert body["message"] == 'pods "twice" already exists'
    status_of(api.http.get("/api/v1/namespaces/elsewhere/pods"), 404, "NotFound")


def test_an_invalid_object_is_refused_with_the_schema_message(api: Api) -> None:
    bad = pod("bad")
    bad["spec"]["containers"][0]["resource"] = {"limits": {"cpu": "1"}}  # a typo: 'resources'
    body = status_of(api.apply(PODS, bad), 422, "Invalid")
    assert "'resource' was unexpected" in body["message"]
    assert body["details"]["causes"][0]["field"] == "spec.containers.0"
    assert api.server.pod("bad") is None
    found = api.server.take_violations()
    assert len(found) == 1 and "'resource' was unexpected" in found[0]


def test_a_private_key_outside_a_secrets_data_is_refused_and_recorded(api: Api) -> None:
    secrets = f"/api/v1/namespaces/{NS}/secrets"
    tls = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": "tls"},
        "stringData": {"tls.key": KEY_PEM, "tls.crt": "CERT"},
    }
    assert api.apply(secrets, tls).status_code == 201  # in a Secret's data: where it belongs
    assert "stringData" not in api.server.objects("Secret")[0]
    leaky = pod("leaky")
    leaky["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": json.dumps(tls)
    }
    status_of(api.apply(PODS, leaky), 422, "Invalid")
    in_env = pod("in-env")
    in_env["spec"]["containers"][0]["env"] = [
        {"name": "FRAMERELAY_WORKER_TLS_KEY_PEM", "value": KEY_PEM}
    ]
    status_of(api.http.post(PODS, json=in_env), 422, "Invalid")
    found = api.server.take_violations()
    assert any("metadata.annotations" in v and "private key" in v for v in found), found
    assert any("spec.containers[0].env[0].value" in v for v in found), found


def test_delete_answers_the_pod_then_it_is_gone_and_other_kinds_answer_a_status(api: Api) -> None:
    assert api.apply(PODS, pod("w-0")).status_code == 201
    wait_for(lambda: condition(api.server.pod("w-0"), "Ready").get("status") == "True", "w-0 Ready")
    deleted = api.http.delete(f"{PODS}/w-0")
    assert deleted.status_code == 202 and deleted.json()["metadata"]["deletionTimestamp"]
    wait_for(lambda: api.server.pod("w-0") is None, "w-0 gone")
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}}
    assert api.http.post(f"/api/v1/namespaces/{NS}/configmaps", json=cm).status_code == 201
    gone = api.http.delete(f"/api/v1/namespaces/{NS}/configmaps/c").json()
    assert (gone["kind"], gone["status"], gone["details"]["name"]) == ("Status", "Success", "c")


def test_list_filters_by_label_and_pages(api: Api) -> None:
    for i in range(3):
        body = pod(f"w-{i}", tolerate=False)
        body["metadata"]["labels"]["tier"] = "a" if i else "b"
        api.apply(PODS, body)
    listed = api.http.get(
        PODS, params={"labelSelector": "tier in (a),app.kubernetes.io/name"}
    ).json()
    assert listed["kind"] == "PodList" and [p["metadata"]["name"] for p in listed["items"]] == [
        "w-1",
        "w-2",
    ]
    assert int(listed["metadata"]["resourceVersion"]) >= 3
    first = api.http.get(PODS, params={"limit": "2"}).json()
    rest = api.http.get(
        PODS, params={"limit": "2", "continue": first["metadata"]["continue"]}
    ).json()
    assert [p["metadata"]["name"] for p in first["items"] + rest["items"]] == ["w-0", "w-1", "w-2"]
    assert "continue" not in rest["metadata"]


# -- watches -----------------------------------------------------------------------------


def test_a_watch_resumes_from_a_version_and_is_told_expired_after_compaction(api: Api) -> None:
    api.apply(PODS, pod("w-0", tolerate=False))
    rv = api.http.get(PODS).json()["metadata"]["resourceVersion"]
    api.apply(PODS, pod("w-1", tolerate=False))
    events = api.watch(PODS, resourceVersion=rv, timeoutSeconds="1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events][:1] == [("ADDED", "w-1")]
    assert all(e["object"]["metadata"]["name"] == "w-1" for e in events)  # nothing from before rv
    assert all(e["object"]["kind"] == "Pod" for e in events)
    from_now = api.watch(PODS, timeoutSeconds="1")  # no version: the current state first
    assert sorted(e["object"]["metadata"]["name"] for e in from_now if e["type"] == "ADDED") == [
        "w-0",
        "w-1",
    ]
    api.server.compact()
    expired = api.watch(PODS, resourceVersion=rv, timeoutSeconds="5")
    assert [e["type"] for e in expired] == ["ERROR"]
    assert (expired[0]["object"]["code"], expired[0]["object"]["reason"]) == (410, "Expired")
    assert expired[0]["object"]["message"].startswith(f"too old resource version: {rv} (")


def test_dropping_watches_ends_the_streams(api: Api) -> None:
    got: list[list[dict[str, Any]]] = []
    reader = threading.Thread(target=lambda: got.append(api.watch(PODS, resourceVersion="1")))
    reader.start()
    time.sleep(0.3)
    api.apply(PODS, pod("w-0", tolerate=False))
    wait_for(lambda: api.server.pod("w-0"), "w-0 stored")
    api.server.drop_watches()
    reader.join(WAIT_S)
    assert not reader.is_alive() and any(e["object"]["metadata"]["name"] == "w-0" for e in got[0])
