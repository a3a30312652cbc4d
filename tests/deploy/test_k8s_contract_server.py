"""The contract Kubernetes API server (tests/support/k8s_api, issue 31 Build point 6)
follows the documented API: driven with raw HTTP and with lightkube's AsyncClient.

Real HTTP on 127.0.0.1. Every test's server ends with no violation (each object it
received and sent fitted the Kubernetes schemas); tests that send bad objects on
purpose take theirs out first.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from lightkube import AsyncClient, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.models.core_v1 import Container as ContainerModel
from lightkube.models.core_v1 import PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from tests.conftest import ROOT, TIMEOUT_FACTOR
from tests.support.k8s_api import (
    GPU_TAINT,
    ContainerStart,
    K8sContractServer,
    NodeSpec,
)
from tests.support.k8s_api.networkpolicy import Client, admitted
from tests.support.k8s_api.rbac import role_rules
from tests.support.k8s_api.scheduler import choose, node_object
from tests.support.waiting import wait_until, wait_until_async

NS = "framerelay"
PODS = f"/api/v1/namespaces/{NS}/pods"
APPLY = {"Content-Type": "application/apply-patch+yaml"}
GPU_NODE = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "1"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
UNTIL_S = 20.0
"""How long a condition may take (x TIMEOUT_FACTOR in wait_until)."""
WAIT_S = UNTIL_S * TIMEOUT_FACTOR
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


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    assert obj is not None
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def ready(server: K8sContractServer, name: str) -> Callable[[], bool]:
    return lambda: condition(server.pod(name), "Ready").get("status") == "True"


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


def test_rbac_refuses_what_the_orchestrators_role_does_not_allow() -> None:
    """With the Role of deploy/k8s the orchestrator may get, create, patch and delete a
    Secret by name but not list Secrets (the namespace's CA and signing keys): 403 in the
    API server's words, recorded as a client error."""
    manifest = ROOT / "deploy" / "k8s" / "base" / "orchestrator.yaml"
    rules = role_rules(manifest, "framerelay-orchestrator")
    with K8sContractServer(nodes=nodes(), rules=rules) as k8s:
        headers = {"Authorization": f"Bearer {k8s.token}"}
        base = f"{k8s.url}/api/v1/namespaces/framerelay"
        assert httpx.get(f"{base}/pods", headers=headers).status_code == 200
        assert httpx.get(f"{base}/secrets/any", headers=headers).status_code == 404
        status_of(httpx.get(f"{base}/secrets", headers=headers), 403, "Forbidden")
        refused = httpx.get(f"{base}/secrets", headers=headers).json()["message"]
        assert refused == (
            'secrets is forbidden: User "system:serviceaccount:framerelay:'
            'framerelay-orchestrator" cannot list resource "secrets" in API group "" in the '
            'namespace "framerelay"'
        )
        assert len(k8s.client_errors) == 2
        k8s.rest.client_errors.clear()


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
    wait_until(
        lambda: condition(api.server.pod("w-0"), "Ready").get("status") == "True",
        UNTIL_S,
        "w-0 Ready",
    )
    deleted = api.http.delete(f"{PODS}/w-0")
    assert deleted.status_code == 202 and deleted.json()["metadata"]["deletionTimestamp"]
    wait_until(lambda: api.server.pod("w-0") is None, UNTIL_S, "w-0 gone")
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
    wait_until(lambda: api.server.pod("w-0"), UNTIL_S, "w-0 stored")
    api.server.drop_watches()
    reader.join(WAIT_S)
    assert not reader.is_alive() and any(e["object"]["metadata"]["name"] == "w-0" for e in got[0])


# -- the scheduler -----------------------------------------------------------------------


def test_an_untolerated_gpu_taint_leaves_the_pod_pending_with_the_schedulers_message(
    api: Api,
) -> None:
    assert api.apply(PODS, pod("plain", tolerate=False)).status_code == 201
    scheduled = wait_until(
        lambda: condition(api.server.pod("plain"), "PodScheduled"), UNTIL_S, "a verdict"
    )
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
    assert scheduled["message"] == (
        "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) had untolerated taint "
        "{nvidia.com/gpu: present}. preemption: 0/3 nodes are available: 1 No preemption victims "
        "found for incoming pod, 2 Preemption is not helpful for scheduling."
    )
    assert api.server.pod("plain")["status"]["phase"] == "Pending"  # type: ignore[index]
    assert api.apply(PODS, pod("tolerant")).status_code == 201
    ready = wait_until(
        lambda: condition(api.server.pod("tolerant"), "Ready").get("status") == "True",
        UNTIL_S,
        "Ready",
    )
    tolerant = api.server.pod("tolerant")
    assert ready and tolerant is not None and tolerant["spec"]["nodeName"] in ("gpu-a", "gpu-b")
    assert tolerant["status"]["phase"] == "Running" and tolerant["status"]["podIP"].startswith(
        "127."
    )


def test_a_pending_pod_is_bound_once_a_gpu_is_freed_or_a_node_added(api: Api) -> None:
    for name in ("a", "b", "c"):
        api.apply(PODS, pod(name))
    wait_until(
        lambda: condition(api.server.pod("c"), "PodScheduled").get("reason") == "Unschedulable",
        UNTIL_S,
        "c waits",
    )
    assert (
        "3 Insufficient nvidia.com/gpu" in condition(api.server.pod("c"), "PodScheduled")["message"]
    )
    api.http.delete(f"{PODS}/a")
    wait_until(
        lambda: condition(api.server.pod("c"), "PodScheduled").get("status") == "True",
        UNTIL_S,
        "c bound",
    )
    api.apply(PODS, pod("d"))
    wait_until(
        lambda: condition(api.server.pod("d"), "PodScheduled").get("reason") == "Unschedulable",
        UNTIL_S,
        "d waits",
    )
    api.server.add_node(NodeSpec("gpu-c", taints=(GPU_TAINT,), allocatable=dict(GPU_NODE)))
    wait_until(
        lambda: (api.server.pod("d") or {}).get("spec", {}).get("nodeName") == "gpu-c",
        UNTIL_S,
        "d on gpu-c",
    )


MIG = "nvidia.com/mig-1g.10gb"
SPOT = {"key": "kubernetes.azure.com/scalesetpriority", "value": "spot", "effect": "NoSchedule"}


ALL = [{"operator": "Exists"}]
"""An empty key with Exists tolerates every taint."""


def required(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    selector = {"nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": selector}}


@pytest.mark.parametrize(
    ("pod_spec", "expected"),
    [
        ({"nodeSelector": {"pool": "gpu"}, "tolerations": ALL}, "gpu-a"),
        (
            {"nodeSelector": {"pool": "tpu"}, "tolerations": ALL},
            "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. "
            "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.",
        ),
        ({"tolerations": ALL}, "gpu-a"),
        (
            {"tolerations": [{"key": "nvidia.com/gpu", "value": "absent"}]},
            "{nvidia.com/gpu: present}",
        ),
        (
            {
                "tolerations": [
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}
                ]
            },
            "{nvidia.com/gpu: present}",
        ),
        ({"tolerations": [GPU_TOLERATION, {"key": SPOT["key"], "operator": "Exists"}]}, "gpu-a"),
        (
            {
                "tolerations": ALL,
                "affinity": required([{"key": "pool", "operator": "NotIn", "values": ["gpu"]}]),
            },
            "spot",
        ),
        (
            {
                "tolerations": ALL,
                "affinity": required(
                    [
                        {"key": "spot", "operator": "Exists"},
                        {"key": "pool", "operator": "DoesNotExist"},
                    ],
                    [{"key": "pool", "operator": "In", "values": ["tpu"]}],
                ),
            },
            "spot",
        ),
        (
            {
                "tolerations": ALL,
                "affinity": required([{"key": "gpu-count", "operator": "Gt", "values": ["4"]}]),
            },
            "3 node(s) didn't match Pod's node affinity/selector",
        ),
    ],
)
def test_the_scheduler_filters(pod_spec: dict[str, Any], expected: str) -> None:
    gpu = {**GPU_NODE, MIG: "7"}
    specs = [
        nodes()[0],
        NodeSpec("gpu-a", {"pool": "gpu", "gpu-count": "1"}, (GPU_TAINT,), gpu),
        NodeSpec("spot", {"spot": "1"}, (SPOT,), gpu),
    ]
    spec = pod("p", tolerate=False, **pod_spec)["spec"]
    node, message = choose(spec, [node_object(n, "127.0.1.1") for n in specs], {})
    assert node == expected if node else expected in message, (node, message)


def test_mig_slices_are_counted_like_gpus() -> None:
    objs = [
        node_object(
            NodeSpec("mig", allocatable={"cpu": "8", "memory": "8Gi", MIG: "2"}), "127.0.1.1"
        )
    ]
    spec = pod("p", tolerate=False)["spec"]
    spec["containers"][0]["resources"] = {"limits": {MIG: "1"}}
    assert choose(spec, objs, {"mig": {MIG: 1}}) == ("mig", "")
    assert choose(spec, objs, {"mig": {MIG: 2}})[1].startswith(
        "0/1 nodes are available: 1 Insufficient nvidia.com/mig"
    )


# -- the kubelet and the failure modes -----------------------------------------------------


def test_an_image_that_does_not_pull_waits_in_image_pull_backoff(api: Api) -> None:
    api.server.set_pullable({"framerelay/worker:0.1.0"})
    api.apply(PODS, pod("typo", image="framerelay/wroker:0.1.0"))

    def waiting() -> str:
        statuses = (api.server.pod("typo") or {}).get("status", {}).get("containerStatuses", [{}])
        return str(statuses[0].get("state", {}).get("waiting", {}).get("reason", ""))

    wait_until(lambda: waiting() == "ImagePullBackOff", UNTIL_S, "ImagePullBackOff")
    events = api.watch(PODS, resourceVersion="1", timeoutSeconds="0.5")
    states = [
        c["state"] for e in events for c in e["object"]["status"].get("containerStatuses", [])
    ]
    seen = [
        s["waiting"] for s in states if s.get("waiting", {}).get("reason") != "ContainerCreating"
    ]
    assert (
        seen[0]["reason"] == "ErrImagePull"
        and 'Failed to pull image "framerelay/wroker:0.1.0"' in seen[0]["message"]
    )
    assert api.server.pod("typo")["status"]["phase"] == "Pending"  # type: ignore[index]
    api.server.set_pullable({"framerelay/wroker:0.1.0"})
    wait_until(
        lambda: condition(api.server.pod("typo"), "Ready").get("status") == "True",
        UNTIL_S,
        "pulled at last",
    )


def test_a_lost_node_makes_its_pods_unready_then_terminating_then_gone(api: Api) -> None:
    api.apply(PODS, pod("w-0", nodeSelector={"kubernetes.io/hostname": "gpu-a"}))
    wait_until(
        lambda: condition(api.server.pod("w-0"), "Ready").get("status") == "True",
        UNTIL_S,
        "w-0 Ready",
    )
    api.server.lose_node("gpu-a", "terminating")
    lost = api.server.pod("w-0")
    assert condition(lost, "Ready")["status"] == "False" and lost is not None
    assert condition(lost, "DisruptionTarget")["reason"] == "DeletionByTaintManager"
    assert lost["metadata"]["deletionTimestamp"]
    node = api.http.get("/api/v1/nodes/gpu-a").json()
    assert condition(node, "Ready")["status"] == "Unknown"
    assert {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"} in node["spec"][
        "taints"
    ]
    api.apply(PODS, pod("w-1", nodeSelector={"kubernetes.io/hostname": "gpu-b"}))
    api.server.lose_node("gpu-b")  # all the way: the node object deleted, its pods removed
    assert api.server.pod("w-1") is None
    status_of(api.http.get("/api/v1/nodes/gpu-b"), 404, "NotFound")


# -- pods as real processes, behind the NetworkPolicies -------------------------------------

HTTP_SERVER = """
import http.server, sys, threading
ip, n, code = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if code != "-":
    raise SystemExit(int(code))
handler = http.server.SimpleHTTPRequestHandler
servers = [http.server.ThreadingHTTPServer((ip, 0), handler) for _ in range(n)]
print(" ".join(str(s.server_port) for s in servers), flush=True)
for s in servers[1:]:
    threading.Thread(target=s.serve_forever, daemon=True).start()
servers[0].serve_forever()
"""


class HttpProcess:
    """A real container process: Python's HTTP server on the pod's address, one port per
    container port (or, with ``exit_code``, a process that exits at once)."""

    def __init__(self, start: ContainerStart, exit_code: int | None) -> None:
        ports = start.container_ports
        code = "-" if exit_code is None else str(exit_code)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HTTP_SERVER, start.ip, str(len(ports)), code],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=start.volumes,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        self.proc.stdout.close()  # it says nothing more
        self._ports = dict(zip(ports, map(int, line), strict=False))

    @property
    def ports(self) -> dict[int, int]:
        return dict(self._ports)

    def exit_code(self) -> int | None:
        return self.proc.poll()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(WAIT_S)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(WAIT_S)


class HttpLauncher:
    def __init__(self) -> None:
        self.exit_code: int | None = None
        self.started: list[HttpProcess] = []

    def __call__(self, start: ContainerStart) -> HttpProcess:
        process = HttpProcess(start, self.exit_code)
        self.started.append(process)
        return process


BIG_GPU = {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"}
WORKER_POLICY = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"name": "framerelay-worker"},
    "spec": {
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "framerelay-worker"}},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [
            {
                "from": [
                    {
                        "podSelector": {
                            "matchLabels": {"app.kubernetes.io/name": "framerelay-orchestrator"}
                        }
                    }
                ],
                "ports": [{"port": 8443, "protocol": "TCP"}],
            }
        ],
        "egress": [],
    },
}
POLICIES = f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies"


@pytest.fixture
def launcher() -> HttpLauncher:
    return HttpLauncher()


@pytest.fixture
def procs(launcher: HttpLauncher) -> Iterator[Api]:
    node = NodeSpec("gpu-8", taints=(GPU_TAINT,), allocatable=dict(BIG_GPU))
    with K8sContractServer(nodes=[node], launcher=launcher) as server:
        client = Api(server)
        yield client
        client.http.close()
        assert server.violations() == []
    assert all(p.exit_code() is not None for p in launcher.started)  # none left running


def probed(name: str, gpus: int = 1, **over: Any) -> dict[str, Any]:
    body = pod(name, gpus=gpus, **over)
    body["spec"]["containers"][0]["readinessProbe"] = {
        "httpGet": {"path": "/", "port": 8443},
        "periodSeconds": 1,
    }
    return body


def reach(ip: str, port: int) -> int | str:
    """An HTTP GET through the pod's port: the status, or how it failed."""
    try:
        return httpx.get(f"http://{ip}:{port}/", timeout=5).status_code
    except httpx.HTTPError as exc:
        return type(exc).__name__


def test_a_network_policy_admitting_8443_only_blocks_8444(procs: Api) -> None:
    procs.apply(PODS, probed("w-0", gpus=2))
    ready = wait_until(
        lambda: condition(procs.server.pod("w-0"), "Ready").get("status") == "True",
        UNTIL_S,
        "Ready",
    )
    ip = procs.server.pod("w-0")["status"]["podIP"]  # type: ignore[index]
    assert ready and reach(ip, 8443) == 200 and reach(ip, 8444) == 200  # no policy: all open
    assert procs.apply(POLICIES, WORKER_POLICY).status_code == 201
    assert procs.server.admitted("w-0", 8443) and not procs.server.admitted("w-0", 8444)
    assert reach(ip, 8443) == 200
    assert reach(ip, 8444) in ("RemoteProtocolError", "ReadError", "ConnectError")
    both = json.loads(json.dumps(WORKER_POLICY))
    both["spec"]["ingress"][0]["ports"] = [{"port": 8443, "endPort": 8444, "protocol": "TCP"}]
    procs.apply(POLICIES, both)
    assert procs.server.admitted("w-0", 8444) and reach(ip, 8444) == 200


def test_network_policy_peers() -> None:
    target = pod("w", gpus=2)
    target["metadata"]["namespace"] = NS
    policy = json.loads(json.dumps(WORKER_POLICY))
    policy["metadata"]["namespace"] = NS
    orchestrator = Client()
    stranger = Client(labels={"app.kubernetes.io/name": "other"})
    elsewhere = Client(namespace="other")
    assert admitted([], target, 8444, stranger)  # no policy selects it: open
    assert admitted([policy], target, 8443, orchestrator)
    assert not admitted([policy], target, 8443, stranger)
    assert not admitted([policy], target, 8443, elsewhere)  # a podSelector alone: same namespace
    policy["spec"]["ingress"][0]["from"] = [
        {"namespaceSelector": {}, "podSelector": {"matchLabels": orchestrator.labels}}
    ]
    policy["spec"]["ingress"][0]["ports"] = [{"port": "tunnel-1"}]  # a named container port
    assert admitted([policy], target, 8444, elsewhere) and not admitted(
        [policy], target, 8443, elsewhere
    )


def test_an_exiting_container_crash_loops_with_its_exit_code(
    procs: Api, launcher: HttpLauncher
) -> None:
    launcher.exit_code = 3
    procs.apply(PODS, probed("crashy"))

    def restarted() -> dict[str, Any] | None:
        statuses = (procs.server.pod("crashy") or {}).get("status", {}).get("containerStatuses", [])
        return statuses[0] if statuses and statuses[0]["restartCount"] >= 2 else None

    status = wait_until(restarted, UNTIL_S, "two restarts")
    assert status["lastState"]["terminated"]["exitCode"] == 3
    assert status["lastState"]["terminated"]["reason"] == "Error"
    assert status["state"].get("waiting", {}).get("reason") in ("CrashLoopBackOff", None)
    assert condition(procs.server.pod("crashy"), "Ready")["status"] == "False"


def test_oom_kill_and_eviction(procs: Api) -> None:
    procs.apply(PODS, probed("w-0"))
    procs.apply(PODS, probed("w-1"))
    for name in ("w-0", "w-1"):
        wait_until(ready(procs.server, name), UNTIL_S, f"{name} Ready")
    procs.server.oom("w-0")

    def oom_killed() -> bool:
        cs = (procs.server.pod("w-0") or {})["status"]["containerStatuses"][0]
        return bool(
            cs["restartCount"] == 1 and cs["lastState"]["terminated"]["reason"] == "OOMKilled"
        )

    wait_until(oom_killed, UNTIL_S, "OOMKilled, restarted")
    wait_until(
        lambda: condition(procs.server.pod("w-0"), "Ready").get("status") == "True",
        UNTIL_S,
        "w-0 back",
    )
    procs.server.evict("w-1")
    evicted = procs.server.pod("w-1")
    assert evicted is not None and evicted["status"]["phase"] == "Failed"
    assert evicted["status"]["reason"] == "Evicted"
    assert condition(evicted, "DisruptionTarget")["reason"] == "TerminationByKubelet"


# -- lightkube's AsyncClient, as the provider talks to the API ------------------------------


def lightkube_pod(name: str) -> Pod:
    container = ContainerModel(name="worker", image="framerelay/worker:0.1.0", args=["worker"])
    meta = ObjectMeta(name=name, labels={"app.kubernetes.io/managed-by": "framerelay"})
    return Pod(metadata=meta, spec=PodSpec(containers=[container]))


async def _watch_until(client: AsyncClient, rv: str, name: str) -> list[tuple[str, str]]:
    """A watch's (type, name) from ``rv`` until ``name`` is added."""
    seen: list[tuple[str, str]] = []
    async for kind, obj in client.watch(Pod, namespace=NS, resource_version=rv):
        assert obj.metadata is not None
        seen.append((kind, str(obj.metadata.name)))
        if seen[-1] == ("ADDED", name):
            break
    return seen


async def test_lightkube_applies_lists_and_watches_from_a_version(
    k8s: K8sContractServer, tmp_path: Path
) -> None:
    config = KubeConfig.from_file(k8s.write_kubeconfig(tmp_path / "kubeconfig"))
    client = AsyncClient(config, field_manager="framerelay")
    try:
        made = await client.apply(lightkube_pod("w-0"), force=True)
        assert made.metadata is not None and made.metadata.managedFields is not None
        assert [m.manager for m in made.metadata.managedFields] == ["framerelay"]
        listed = client.list(
            Pod, namespace=NS, labels={"app.kubernetes.io/managed-by": "framerelay"}
        )
        assert [p.metadata.name async for p in listed if p.metadata] == ["w-0"]
        watch = asyncio.create_task(_watch_until(client, listed.resourceVersion, "w-1"))
        await client.apply(lightkube_pod("w-1"), force=True)
        seen = await asyncio.wait_for(watch, WAIT_S)
        assert ("ADDED", "w-0") not in seen  # only what came after the list
        await client.delete(Pod, "w-1", namespace=NS)
    finally:
        await client.close()

    assert k8s.creates == {f"{NS}/w-0": 1, f"{NS}/w-1": 1}


async def test_lightkube_resumes_after_a_dropped_watch_and_relists_after_410(
    k8s: K8sContractServer, tmp_path: Path
) -> None:
    """A watch the server ends is resumed from the last version seen (no event twice);
    once the history is compacted past that version while the client was away, the
    version is refused with 410 Expired and the client lists again: every pod once,
    none created twice."""

    config = KubeConfig.from_file(k8s.write_kubeconfig(tmp_path / "kc"))
    client = AsyncClient(config, field_manager="fr")
    try:
        await client.apply(lightkube_pod("w-0"), force=True)
        listed = client.list(Pod, namespace=NS)
        names = [p.metadata.name async for p in listed if p.metadata]
        seen: list[tuple[str, str, str]] = []
        away = asyncio.Event()
        back = asyncio.Event()

        async def follow() -> None:
            rv = listed.resourceVersion
            async for kind, obj in client.watch(Pod, namespace=NS, resource_version=rv):
                assert obj.metadata is not None
                seen.append((kind, str(obj.metadata.name), str(obj.metadata.resourceVersion)))
                if obj.metadata.name == "w-2" and not away.is_set():
                    away.set()
                    await back.wait()  # the client stops reading: it is away

        task = asyncio.create_task(follow())
        await client.apply(lightkube_pod("w-1"), force=True)
        await wait_until_async(lambda: any(n == "w-1" for _, n, _ in seen), UNTIL_S, "w-1")
        k8s.drop_watches()
        await client.apply(lightkube_pod("w-2"), force=True)
        await asyncio.wait_for(away.wait(), WAIT_S)
        versions = [rv for _, _, rv in seen]
        assert len(versions) == len(set(versions)) and versions == sorted(versions, key=int)
        assert [n for kind, n, _ in seen if kind == "ADDED"] == ["w-1", "w-2"]
        k8s.drop_watches()
        await wait_until_async(lambda: k8s.open_watches == 0, UNTIL_S, "the watch ended")
        await client.apply(lightkube_pod("w-3"), force=True)
        k8s.compact()
        back.set()
        with pytest.raises(ApiError) as gone:
            await asyncio.wait_for(task, WAIT_S)
        assert (gone.value.status.code, gone.value.status.reason) == (410, "Expired")
        relisted = [p.metadata.name async for p in client.list(Pod, namespace=NS) if p.metadata]
        assert relisted == ["w-0", "w-1", "w-2", "w-3"] and names == ["w-0"]
    finally:
        await client.close()

    assert k8s.creates == {f"{NS}/w-{i}": 1 for i in range(4)}
