"""deploy/k8s: the base and its dev and prod overlays, rendered by the real `kubectl
kustomize` and validated by kubernetes-validate (tests/deploy/k8s_checks.py), then
checked object by object (a table of checks per kind) and as a whole: who holds which
secret, what the NetworkPolicies admit, the RBAC of the orchestrator's kubernetes
provider, Redis on its PVC, the ingest with its Redis URL, images and GPUs per overlay,
and that every FRAMERELAY_* variable names a setting of its service."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

import pytest

from deploy.models import PodSpec
from deploy.providers.kubernetes import render
from deploy.settings import WORKER_IMAGE, KubernetesSettings, OrchestratorSettings
from framerelay import __version__
from framerelay.settings import ServiceSettings
from gpu_worker.settings import WorkerSettings
from ingest.settings import IngestSettings
from tests.deploy.k8s_checks import (
    KIND_CHECKS,
    Obj,
    admitted_ports,
    containers,
    env,
    pod_labels,
    pod_spec,
    schema_problems,
    selects,
)
from tests.deploy.k8s_checks import render as kustomize

OVERLAYS = ("dev", "prod")
APPS = ("redis", "framerelay-worker", "framerelay-ingest", "framerelay-orchestrator")
SETTINGS: dict[str, type[ServiceSettings]] = {
    "worker": WorkerSettings,
    "ingest": IngestSettings,
    "orchestrator": OrchestratorSettings,
}
SERVICE_IMAGE = f"framerelay/service:{__version__}"
WORKER_IMAGES = {"dev": f"{WORKER_IMAGE}-cpu", "prod": WORKER_IMAGE}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Obj]]:
    return {overlay: kustomize(overlay) for overlay in OVERLAYS}


def _of(docs: list[Obj], kind: str) -> dict[str, Obj]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _container(docs: list[Obj], deployment: str) -> Obj:
    return containers(_of(docs, "Deployment")[deployment])[0]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_kubernetes_schema(
    overlay: str, rendered: dict[str, list[Obj]]
) -> None:
    docs = rendered[overlay]
    assert [p for d in docs for p in schema_problems(d)] == []
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for app in APPS:
        assert {("Deployment", app), ("Service", app)} <= kinds
    assert ("Namespace", "framerelay") in kinds
    for d in docs:
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "framerelay", d["metadata"]
        assert d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "framerelay"


@pytest.mark.parametrize("kind", sorted(KIND_CHECKS))
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_of_a_kind(overlay: str, kind: str, rendered: dict[str, list[Obj]]) -> None:
    docs = rendered[overlay]
    deployments = list(_of(docs, "Deployment").values())
    objects = list(_of(docs, kind).values())
    assert objects, f"no {kind} in {overlay}"
    assert [p for obj in objects for p in KIND_CHECKS[kind](obj, deployments)] == []


def _kind_none(docs: list[Obj]) -> None:
    assert not _of(docs, "Secret"), "Secrets are created by the operator, never written here"
    assert not _of(docs, "ClusterRole") and not _of(docs, "ClusterRoleBinding")
    text = repr(docs)
    assert "PRIVATE KEY" not in text and "latest" not in text


def _redis_url(c: Obj, name: str) -> None:
    variables = env(c)
    password = variables["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert password == {"name": "framerelay-redis", "key": "password"}
    names = list(variables)
    assert names.index("REDIS_PASSWORD") < names.index(name)  # $(...) sees earlier vars only
    url = urlsplit(variables[name]["value"])
    assert (url.scheme, url.password, url.hostname, url.port) == (
        "redis",
        "$(REDIS_PASSWORD)",
        "redis",
        6379,
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_redis_on_its_pvc_and_the_services_with_its_url(
    overlay: str, rendered: dict[str, list[Obj]]
) -> None:
    docs = rendered[overlay]
    _kind_none(docs)
    redis = _of(docs, "Deployment")["redis"]
    mounts = {m["name"]: m["mountPath"] for m in _container(docs, "redis")["volumeMounts"]}
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in pod_spec(redis)["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert claims == {"data": "redis-data"} and mounts["data"] == "/data"
    assert "--appendonly" in _container(docs, "redis")["args"]
    assert _of(docs, "Service")["redis"]["spec"]["ports"][0]["port"] == 6379
    _redis_url(_container(docs, "framerelay-ingest"), "FRAMERELAY_INGEST_REDIS_URL")
    _redis_url(_container(docs, "framerelay-orchestrator"), "FRAMERELAY_ORCH_REDIS_URL")
    size = _of(docs, "PersistentVolumeClaim")["redis-data"]["spec"]["resources"]["requests"]
    assert size["storage"] == {"dev": "1Gi", "prod": "20Gi"}[overlay]


def _secret_volumes(dep: Obj) -> set[str]:
    return {v["secret"]["secretName"] for v in pod_spec(dep).get("volumes", []) if "secret" in v}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_who_holds_which_secret(overlay: str, rendered: dict[str, list[Obj]]) -> None:
    deps = _of(rendered[overlay], "Deployment")
    assert _secret_volumes(deps["framerelay-worker"]) == {"framerelay-worker-tls"}
    assert _secret_volumes(deps["redis"]) == set()
    for name in ("framerelay-ingest", "framerelay-orchestrator"):
        assert "framerelay-signing-keys" in _secret_volumes(deps[name])
        variables = env(containers(deps[name])[0])
        assert variables["FRAMERELAY_SIGNING_KEYS_FILE"]["value"].startswith("/etc/framerelay/")
        assert not any("TOKEN_SECRETS" in n for n in variables)
    worker = env(containers(deps["framerelay-worker"])[0])
    assert not {n for n in worker if n.startswith(("FRAMERELAY_SIGNING", "FRAMERELAY_TOKEN"))}
    assert worker["FRAMERELAY_WORKER_TUNNEL_KEYS_FILE"]["value"].endswith("/public.jwks")
    for name, dep in deps.items():  # only the orchestrator talks to the Kubernetes API
        automount = pod_spec(dep).get("automountServiceAccountToken", True)
        assert automount is (name == "framerelay-orchestrator"), name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies(overlay: str, rendered: dict[str, list[Obj]]) -> None:
    docs = rendered[overlay]
    policies = list(_of(docs, "NetworkPolicy").values())
    deny = [p for p in policies if p["spec"]["podSelector"] == {} and not p["spec"].get("ingress")]
    assert deny and deny[0]["spec"]["policyTypes"] == ["Ingress"]
    by_app = {
        p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"]: p
        for p in policies
        if "matchLabels" in p["spec"]["podSelector"]
    }
    assert set(by_app) == set(APPS)
    metrics = _of(docs, "NetworkPolicy")["framerelay-metrics"]
    (rule,) = metrics["spec"]["ingress"]
    assert all(
        p["podSelector"]["matchLabels"] == {"framerelay.io/metrics-scraper": "true"}
        for p in rule["from"]
    )
    assert not selects(metrics, {"app.kubernetes.io/name": "redis"})
    for app in ("redis", "framerelay-worker"):  # from the ingest and the orchestrator only
        (rule,) = by_app[app]["spec"]["ingress"]
        peers = {p["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for p in rule["from"]}
        assert peers == {"framerelay-ingest", "framerelay-orchestrator"} and all(
            "namespaceSelector" not in p for p in rule["from"]
        )
        spec = by_app[app]["spec"]
        assert spec["egress"] == [] and "Egress" in spec["policyTypes"]  # they call no one
    # the orchestrator's own worker pods fall under the workers' policy
    spec = PodSpec(name="fr-x-0-g0", tier="x", gpu_types=("L4",), spot=False, gpu_count=2)
    policy, _service, pod = render.render_pod_objects(spec, KubernetesSettings())
    assert selects(by_app["framerelay-worker"], pod["metadata"]["labels"])
    # and each brings its own policy: the same peers, on every worker's port
    for app in ("framerelay-ingest", "framerelay-orchestrator"):
        peer = pod_labels(_of(docs, "Deployment")[app])
        assert (
            admitted_ports(policy, peer)
            == {8443, 8444}
            >= admitted_ports(by_app["framerelay-worker"], peer)
        )


def test_orchestrator_rbac_covers_its_kubernetes_provider(rendered: dict[str, list[Obj]]) -> None:
    docs = rendered["prod"]
    orch = _of(docs, "Deployment")["framerelay-orchestrator"]
    account = pod_spec(orch)["serviceAccountName"]
    assert account in _of(docs, "ServiceAccount")
    binding = _of(docs, "RoleBinding")[account]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": "framerelay"}
    ]
    role = _of(docs, "Role")[binding["roleRef"]["name"]]
    granted = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    # server-side apply is a PATCH that creates what is not there yet: patch and create
    applied = {
        ("", "pods"),
        ("", "services"),
        ("", "secrets"),
        ("networking.k8s.io", "networkpolicies"),
        ("policy", "poddisruptionbudgets"),
    }
    needed = {(g, r, v) for g, r in applied for v in ("get", "create", "patch", "delete")}
    needed |= {("", "pods", "list"), ("", "pods", "watch")}
    assert needed <= granted, needed - granted
    assert not any(v in ("*", "escalate", "bind", "impersonate") for _, _, v in granted)
    assert {("", "secrets", v) for v in ("list", "watch")}.isdisjoint(granted)  # by name only
    assert not {g for g, _, _ in granted} & {"apps", "batch"}  # no controller but itself
    variables = env(containers(orch)[0])
    assert variables["FRAMERELAY_ORCH_PROVIDER"]["value"] == "kubernetes"
    namespace = variables["FRAMERELAY_ORCH_KUBERNETES__NAMESPACE"]["valueFrom"]["fieldRef"]
    assert namespace == {"fieldPath": "metadata.namespace"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_and_gpus_per_overlay(overlay: str, rendered: dict[str, list[Obj]]) -> None:
    docs = rendered[overlay]
    worker = _container(docs, "framerelay-worker")
    assert worker["image"] == WORKER_IMAGES[overlay]
    for name in ("framerelay-ingest", "framerelay-orchestrator"):
        assert _container(docs, name)["image"] == SERVICE_IMAGE
    orch = env(_container(docs, "framerelay-orchestrator"))
    assert orch["FRAMERELAY_ORCH_KUBERNETES__IMAGE"]["value"] == worker["image"]
    gpus = {
        c["name"]: c["resources"]["limits"].get("nvidia.com/gpu")
        for d in docs
        if d["kind"] == "Deployment"
        for c in containers(d)
    }
    assert gpus == {
        "redis": None,
        "worker": {"dev": None, "prod": 1}[overlay],
        "ingest": None,
        "orchestrator": None,
    }
    if overlay == "prod":  # the orchestrator's 1-GPU pods are sized and placed as the pool
        spec = PodSpec(name="fr-x-0-g0", tier="x", gpu_types=("L4",), spot=False)
        made = render.render_pod(spec, KubernetesSettings())
        assert worker["resources"] == made["spec"]["containers"][0]["resources"]
        tolerations = pod_spec(_of(docs, "Deployment")["framerelay-worker"])["tolerations"]
        assert tolerations == made["spec"]["tolerations"]


Check = Callable[[dict[str, str]], str | None]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_framerelay_variable_names_a_setting(
    overlay: str, rendered: dict[str, list[Obj]]
) -> None:
    """Unknown FRAMERELAY_* variables stop a service at start: none may be in a manifest."""
    seen = set()
    for d in rendered[overlay]:
        if d["kind"] != "Deployment" or d["metadata"]["name"] == "redis":
            continue
        for c in containers(d):
            check: Check = SETTINGS[c["name"]].env_problem
            names = {n: "x" for n in env(c) if n.startswith("FRAMERELAY_")}
            assert check(names) is None, (d["metadata"]["name"], check(names))
            seen.add(c["name"])
    assert seen == set(SETTINGS)
