"""Deploy artifacts, validated without Docker or a cluster: compose file, the
manifests the kubernetes provider renders (deploy/k8s itself: test_kustomize.py),
and the Dockerfiles (base images, model baked in, ports, probes, GPU resources).

Who holds what: the signing keys reach only the ingest and the orchestrator,
as secret files; workers get the public key set; no API is published beyond
the host's loopback (compose) or the cluster (ClusterIP)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]
from pydantic import SecretStr

from deploy.ca import PodCA
from deploy.models import PodSpec
from deploy.providers.kubernetes.render import render_pod_objects
from deploy.settings import KubernetesSettings
from tests.conftest import ROOT
from tests.deploy.k8s_checks import (
    K8S_VERSIONS,
    deployment_problems,
    key_leaks,
    schema_problems,
    service_problems,
)

DEPLOY = ROOT / "deploy"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc["spec"]["template"]["spec"]["containers"])


SIGNING = "FRAMERELAY_SIGNING_KEYS"
TUNNEL_KEYS = "FRAMERELAY_WORKER_TUNNEL_KEYS"


def _env_names(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


def _check_worker_container(c: dict[str, Any]) -> None:
    assert c["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8443, "scheme": "HTTPS"}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {"containerPort": 8443, "name": "tunnel", "protocol": "TCP"} in c["ports"]
    env = _env_names(c)
    assert not {n for n in env if n.startswith((SIGNING, "FRAMERELAY_TOKEN_SECRETS"))}
    assert env["FRAMERELAY_WORKER_TLS_CERT"]["value"] == "/etc/framerelay/tls/tls.crt"
    assert env["FRAMERELAY_WORKER_TLS_KEY"]["value"] == "/etc/framerelay/tls/tls.key"
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/etc/framerelay/tls"]["readOnly"] is True


def _published(port: str) -> bool:
    """True when a compose port mapping listens beyond the host's loopback."""
    return not str(port).startswith("127.0.0.1:")


def test_compose_file() -> None:
    (doc,) = _docs(DEPLOY / "docker" / "docker-compose.yml")
    services = doc["services"]
    assert set(services) == {"redis", "ca", "worker", "ingest", "orchestrator"}
    gpu = services["worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]
    assert "/readyz" in " ".join(services["worker"]["healthcheck"]["test"])
    assert services["worker"]["build"]["dockerfile"] == "deploy/docker/worker-cuda.Dockerfile"
    assert services["orchestrator"]["command"] == ["orchestrator"]
    orch_env = services["orchestrator"]["environment"]
    assert orch_env["FRAMERELAY_ORCH_REDIS_URL"].startswith("redis://redis:")
    for name, svc in services.items():
        assert not any(_published(p) for p in svc.get("ports", [])), (name, svc["ports"])
        env = svc.get("environment") or {}
        assert not any("TOKEN_SECRETS" in k for k in env), name  # HS256 secrets: gone
        holds_keys = env.get(f"{SIGNING}_FILE") == "/run/secrets/signing_keys"
        assert holds_keys is (name in ("ingest", "orchestrator")), name
        assert SIGNING not in env and ("signing_keys" in svc.get("secrets", [])) is holds_keys
    worker = services["worker"]["environment"]
    assert worker[f"{TUNNEL_KEYS}_FILE"] == "/run/secrets/tunnel_keys"
    assert services["worker"]["secrets"] == ["tunnel_keys"]
    assert "wss://" in " ".join(services["ingest"]["command"])
    assert services["ingest"]["environment"]["FRAMERELAY_INGEST_TLS_CA"].endswith("/ca.pem")
    worker_volumes = " ".join(services["worker"]["volumes"])
    assert "pod-ca" not in worker_volumes  # never ca.key
    assert all(v.endswith(":ro") for v in services["worker"]["volumes"] if "worker-tls" in v)
    assert set(doc["secrets"]) == {"signing_keys", "tunnel_keys"}


def _pod_spec(folder: Path, tier: str = "ondemand") -> PodSpec:
    ca = PodCA.load_or_create(folder / "ca")
    name = f"fr-{tier}-0-g3"
    cert, key = ca.issue(name, [f"{name}.pods.framerelay"])
    return PodSpec(
        name=name,
        tier=tier,
        gpu_types=("L4",),
        spot=False,
        env={"FRAMERELAY_WORKER_WORKER_ID": name, TUNNEL_KEYS: '{"keys": []}'},
        secret_env={
            "FRAMERELAY_WORKER_TLS_CERT_PEM": SecretStr(cert),
            "FRAMERELAY_WORKER_TLS_KEY_PEM": SecretStr(key),
            "FRAMERELAY_EXTRA_SECRET": SecretStr("never-in-a-manifest-" * 2),
        },
        tls_server_name=f"{name}.pods.framerelay",
    )


def test_kubernetes_provider_renders_a_gpu_worker(tmp_path: Path) -> None:
    spec = _pod_spec(tmp_path)
    settings = KubernetesSettings(image="reg/worker:1")
    objects = render_pod_objects(spec, settings)
    assert [o["kind"] for o in objects] == ["Secret", "NetworkPolicy", "Service", "Pod"]
    secret, _policy, service, pod = objects
    assert {o["metadata"]["name"] for o in objects} == {spec.name}
    for obj in objects:
        assert (
            obj["metadata"]["labels"].items()
            >= {
                "app.kubernetes.io/managed-by": "framerelay-orchestrator",
                "framerelay/pod": spec.name,
                "framerelay/tier": "ondemand",
            }.items()
        )
    (container,) = pod["spec"]["containers"]
    _check_worker_container(container)
    extra = _env_names(container)["FRAMERELAY_EXTRA_SECRET"]
    assert extra["valueFrom"]["secretKeyRef"]["name"] == settings.secret_name
    assert container["image"] == "reg/worker:1"
    assert service["spec"]["selector"] == {"framerelay/pod": spec.name}
    assert pod["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]  # the GPU taint of GKE, EKS, most clusters: the pod would stay Pending without it
    tls = {"name": "tls", "secret": {"secretName": spec.name, "defaultMode": 0o440}}
    assert pod["spec"]["volumes"][0] == tls
    # as deploy/k8s's own Deployments: the namespace enforces the restricted standard
    for version in K8S_VERSIONS:
        assert [p for o in objects for p in schema_problems(o, version)] == []
    assert deployment_problems(pod) == [] and service_problems(service, [pod]) == []
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/tmp", "/var/cache/framerelay/trt"}
    assert secret["type"] == "kubernetes.io/tls" and set(secret) == {
        "apiVersion",
        "kind",
        "metadata",
        "type",
        "data",
    }
    key_pem = spec.secret_env["FRAMERELAY_WORKER_TLS_KEY_PEM"].get_secret_value()
    assert base64.b64decode(secret["data"]["tls.key"]).decode() == key_pem
    plain = PodSpec(name="fr-x-0-g0", tier="x", gpu_types=("L4",), spot=False)
    assert [o["kind"] for o in render_pod_objects(plain, settings)] == [
        "NetworkPolicy",
        "Service",
        "Pod",
    ]


def test_no_object_carries_the_private_key_outside_its_secret_data(tmp_path: Path) -> None:
    """Every string of every object (keys, values, annotations, env) is scanned for the
    PEM, its body and its base64: only the Secret's ``data`` holds it. Server-side apply
    keeps no last-applied annotation, so nothing else carries a copy to the API server."""
    spec = _pod_spec(tmp_path)
    key_pem = spec.secret_env["FRAMERELAY_WORKER_TLS_KEY_PEM"].get_secret_value()
    objects = render_pod_objects(spec, KubernetesSettings())
    assert key_leaks(objects, key_pem) == []
    assert "never-in-a-manifest" not in yaml.safe_dump_all(objects)
    # the scan sees a key where it must not be (as client-side apply's annotation held it)
    secret = objects[0]
    leaked = {**secret, "metadata": {**secret["metadata"], "annotations": {"x": repr(secret)}}}
    assert key_leaks([leaked], key_pem) == [
        "Secret/fr-ondemand-0-g3/metadata/annotations/x: holds the private key"
    ]
    pod = objects[-1]
    env = [{"name": "K", "value": key_pem}]
    leaked_pod = {
        **pod,
        "spec": {**pod["spec"], "containers": [{**pod["spec"]["containers"][0], "env": env}]},
    }
    assert len(key_leaks([leaked_pod], key_pem)) == 1


def _instructions(path: Path) -> list[tuple[str, str]]:
    lines, cur = [], ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        if raw.strip().startswith("#") or not raw.strip():
            continue
        cur += raw.rstrip("\\").strip() + " "
        if not raw.rstrip().endswith("\\"):
            op, _, arg = cur.strip().partition(" ")
            lines.append((op.upper(), arg))
            cur = ""
    return lines


def test_worker_dockerfile() -> None:
    """The image contract is run in tests/packaging/test_containers.py; here the build."""
    ins = _instructions(DEPLOY / "docker" / "worker-cuda.Dockerfile")
    bases = [arg for op, arg in ins if op == "FROM"]
    assert bases[-1].startswith("nvidia/cuda:") and "runtime" in bases[-1]
    text = " ".join(f"{op} {arg}" for op, arg in ins)
    assert "/wheels/framerelay-*.whl)[gpu]" in text and "onnxruntime-gpu==" in text
    assert (ROOT / "framerelay" / "_data" / "yolox_nano_416.onnx").exists()  # in the wheel
    assert ("EXPOSE", "8443") in ins and any(
        op == "HEALTHCHECK" and "/readyz" in a for op, a in ins
    )
    assert ins[-1] == ("CMD", '["worker"]') and ("USER", "65534:65534") in ins


def test_service_dockerfile() -> None:
    ins = _instructions(DEPLOY / "docker" / "service.Dockerfile")
    assert [arg for op, arg in ins if op == "FROM"][-1] == "python:3.11-slim-bookworm"
    text = " ".join(f"{op} {arg}" for op, arg in ins)
    assert "/wheels/framerelay-*.whl)[cpu]" in text and ("EXPOSE", "8080 8090") in ins
    assert "kubectl" not in text  # the Kubernetes provider speaks to the API (lightkube)
