"""Deploy artifacts, validated without Docker or a cluster: compose file, the
Kubernetes manifests, the manifests the kubernetes provider renders, and the
Dockerfiles (base images, model baked in, ports, probes, GPU resources)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import SecretStr

from deploy.models import PodSpec
from deploy.providers.kubernetes import render_worker
from deploy.settings import KubernetesSettings
from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc["spec"]["template"]["spec"]["containers"])


def _check_worker_container(c: dict[str, Any]) -> None:
    assert c["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8443}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {"containerPort": 8443, "name": "tunnel", "protocol": "TCP"} in c["ports"]
    secret_env = [e for e in c["env"] if e["name"] == "FRAMERELAY_TOKEN_SECRETS"]
    assert secret_env and "valueFrom" in secret_env[0] and "value" not in secret_env[0]


def test_compose_file() -> None:
    (doc,) = _docs(DEPLOY / "docker" / "docker-compose.yml")
    services = doc["services"]
    assert set(services) == {"redis", "worker", "ingest", "orchestrator"}
    gpu = services["worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]
    assert "/readyz" in " ".join(services["worker"]["healthcheck"]["test"])
    assert services["worker"]["build"]["dockerfile"] == "deploy/docker/worker.Dockerfile"
    assert services["orchestrator"]["command"] == ["orchestrator"]
    orch_env = services["orchestrator"]["environment"]
    assert orch_env["FRAMERELAY_ORCH_REDIS_URL"].startswith("redis://redis:")
    for svc in services.values():  # secrets come from the environment, never inline
        for value in (svc.get("environment") or {}).values():
            assert "SECRETS" not in str(value) or str(value).startswith("${")


def test_kubernetes_manifests() -> None:
    docs = _docs(DEPLOY / "k8s" / "framerelay.yaml")
    by = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for name in ("redis", "framerelay-worker", "framerelay-ingest", "framerelay-orchestrator"):
        assert ("Deployment", name) in by and ("Service", name) in by
    for d in docs:
        assert d["apiVersion"] and d["metadata"].get("namespace") == "framerelay"
        if d["kind"] == "Deployment":
            labels = d["spec"]["template"]["metadata"]["labels"]
            assert d["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (worker,) = [d for d in docs if d["metadata"]["name"] == "framerelay-worker"
                 and d["kind"] == "Deployment"]  # fmt: skip
    _check_worker_container(_containers(worker)[0])
    images = {c["image"] for d in docs if d["kind"] == "Deployment" for c in _containers(d)}
    assert {"framerelay/worker:latest", "framerelay/service:latest"} <= images


@pytest.mark.parametrize("spot", [False, True])
def test_kubernetes_provider_renders_a_gpu_worker(spot: bool) -> None:
    spec = PodSpec(
        name="fr-spot-0-g3", tier="spot", gpu_types=("L4",), spot=spot,
        env={"FRAMERELAY_WORKER_WORKER_ID": "fr-spot-0-g3"},
        secret_env={"FRAMERELAY_TOKEN_SECRETS": SecretStr("never-in-a-manifest-" * 2)},
    )  # fmt: skip
    deployment, service = render_worker(spec, KubernetesSettings(image="reg/worker:1"))
    text = yaml.safe_dump_all([deployment, service])
    assert "never-in-a-manifest" not in text
    assert deployment["kind"] == "Deployment" and deployment["spec"]["replicas"] == 1
    assert deployment["metadata"]["name"] == service["metadata"]["name"] == "fr-spot-0-g3"
    (container,) = _containers(deployment)
    _check_worker_container(container)
    assert container["image"] == "reg/worker:1"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    tolerations = deployment["spec"]["template"]["spec"].get("tolerations")
    assert bool(tolerations) is spot


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
    ins = _instructions(DEPLOY / "docker" / "worker.Dockerfile")
    assert ins[0][0] == "FROM" and ins[0][1].startswith("nvidia/cuda:") and "runtime" in ins[0][1]
    text = " ".join(f"{op} {arg}" for op, arg in ins)
    assert '".[gpu]"' in text  # onnxruntime-gpu
    assert "COPY samples/models/yolox_nano_416.onnx" in text  # the model baked in
    assert "FRAMERELAY_WORKER_DETECTOR__MODEL=/opt/framerelay/models/model.onnx" in text
    assert ("EXPOSE", "8443") in ins and any(
        op == "HEALTHCHECK" and "/readyz" in a for op, a in ins
    )
    assert ins[-1] == ("CMD", '["worker"]') and ("USER", "65534") in ins
    assert (ROOT / "samples" / "models" / "yolox_nano_416.onnx").exists()


def test_service_dockerfile() -> None:
    ins = _instructions(DEPLOY / "docker" / "service.Dockerfile")
    assert ins[0] == ("FROM", "python:3.11-slim")
    text = " ".join(f"{op} {arg}" for op, arg in ins)
    assert '".[cpu]"' in text and ("EXPOSE", "8080 8090") in ins
    for src in ("framerelay", "ingest", "deploy", "gpu_worker", "tracker"):
        assert f"COPY {src} ./{src}" in text and (ROOT / src).is_dir()
