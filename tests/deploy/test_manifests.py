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

import pytest
import yaml  # type: ignore[import-untyped]
from pydantic import SecretStr

from deploy.ca import PodCA
from deploy.models import PodSpec
from deploy.providers.kubernetes.render import render_tls_secret, render_worker
from deploy.settings import KubernetesSettings
from tests.conftest import ROOT
from tests.deploy.k8s_checks import deployment_problems, schema_problems, service_problems

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


def _pod_spec(spot: bool, folder: Path) -> PodSpec:
    ca = PodCA.load_or_create(folder / "ca")
    cert, key = ca.issue("fr-spot-0-g3", ["fr-spot-0-g3.pods.framerelay"])
    return PodSpec(
        name="fr-spot-0-g3", tier="spot", gpu_types=("L4",), spot=spot,
        env={"FRAMERELAY_WORKER_WORKER_ID": "fr-spot-0-g3", TUNNEL_KEYS: '{"keys": []}'},
        secret_env={"FRAMERELAY_WORKER_TLS_CERT_PEM": SecretStr(cert),
                    "FRAMERELAY_WORKER_TLS_KEY_PEM": SecretStr(key),
                    "FRAMERELAY_EXTRA_SECRET": SecretStr("never-in-a-manifest-" * 2)},
        tls_server_name="fr-spot-0-g3.pods.framerelay",
    )  # fmt: skip


@pytest.mark.parametrize("spot", [False, True])
def test_kubernetes_provider_renders_a_gpu_worker(spot: bool, tmp_path: Path) -> None:
    spec = _pod_spec(spot, tmp_path)
    settings = KubernetesSettings(image="reg/worker:1")
    deployment, service = render_worker(spec, settings)
    text = yaml.safe_dump_all([deployment, service])
    key_pem = spec.secret_env["FRAMERELAY_WORKER_TLS_KEY_PEM"].get_secret_value()
    assert "never-in-a-manifest" not in text and "PRIVATE KEY" not in text
    assert base64.b64encode(key_pem.encode()).decode()[:40] not in text
    assert deployment["kind"] == "Deployment" and deployment["spec"]["replicas"] == 1
    assert deployment["metadata"]["name"] == service["metadata"]["name"] == "fr-spot-0-g3"
    (container,) = _containers(deployment)
    _check_worker_container(container)
    extra = _env_names(container)["FRAMERELAY_EXTRA_SECRET"]
    assert extra["valueFrom"]["secretKeyRef"]["name"] == settings.secret_name
    assert container["image"] == "reg/worker:1"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    pod = deployment["spec"]["template"]["spec"]
    assert bool(pod.get("tolerations")) is spot
    assert pod["volumes"][0] == {"name": "tls", "secret": {"secretName": "fr-spot-0-g3",
                                                           "defaultMode": 0o440}}  # fmt: skip
    # as deploy/k8s's own Deployments: the namespace enforces the restricted standard
    assert [p for d in (deployment, service) for p in schema_problems(d)] == []
    assert deployment_problems(deployment) == []
    assert service_problems(service, [deployment]) == []
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/tmp", "/var/cache/framerelay/trt"}
    secret = render_tls_secret(spec, settings)
    assert secret is not None and secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["name"] == "fr-spot-0-g3"
    assert base64.b64decode(secret["data"]["tls.key"]).decode() == key_pem
    plain = PodSpec(name="fr-x-0-g0", tier="x", gpu_types=("L4",), spot=False)
    assert render_tls_secret(plain, settings) is None


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
    assert "/usr/local/bin/kubectl" in text
