"""deploy/docker/docker-compose.yml: valid, single-host by default, consistent names.

``docker compose config`` is not installable here (Debian 12 has only the old
Python docker-compose 1.29, which predates the compose spec), so the file is
validated against the compose-spec JSON schema that check-jsonschema ships
(``--builtin-schema vendor.compose-spec``). Then each framerelay service's
environment, with compose's ``${VAR:-default}`` taken at its default (no
RunPod key, no variables set), loads into that service's settings model in a
fresh process: the orchestrator starts on the local provider.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from deploy.settings import WORKER_IMAGE
from framerelay import __version__
from tests.packaging.dockerfile import parse
from tests.packaging.wheel_env import ROOT

COMPOSE = ROOT / "deploy" / "docker" / "docker-compose.yml"
SETTINGS = {
    "worker": "gpu_worker.settings:WorkerSettings",
    "ingest": "ingest.settings:IngestSettings",
    "orchestrator": "deploy.settings:OrchestratorSettings",
}


def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def interpolate(value: str) -> str:
    """Compose's ``${NAME:-default}`` and ``${NAME}`` with no variable set."""
    return re.sub(r"\$\{\w+(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)


def test_compose_file_follows_the_compose_spec() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
         str(COMPOSE)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_images_are_named_alike_everywhere() -> None:
    services = compose()["services"]
    assert services["worker"]["image"] == WORKER_IMAGE == f"framerelay/worker:{__version__}"
    makefile = (ROOT / "Makefile").read_text()
    for name, service in services.items():
        build = service.get("build")
        if build is None:
            continue
        dockerfile = ROOT / build["dockerfile"]
        assert dockerfile.is_file(), name
        assert f"-t {service['image']}" in makefile.replace("$(VERSION)", __version__), name
    images = {s["image"] for s in services.values() if s["image"].startswith("framerelay/")}
    assert images == {WORKER_IMAGE, f"framerelay/service:{__version__}"}


def test_framerelay_services_run_read_only_with_their_volumes() -> None:
    services = compose()["services"]
    for name, service in services.items():
        if not service["image"].startswith("framerelay/"):
            continue
        assert service.get("read_only") is True and "/tmp" in service.get("tmpfs", []), name
        if name == "ca":  # one-shot: writes only the CA and certificate volumes it mounts
            continue
        dockerfile = "service" if "service" in service["image"] else "worker-cuda"
        stage = parse(ROOT / "deploy" / "docker" / f"{dockerfile}.Dockerfile")
        named = [v.split(":")[1] for v in service.get("volumes", []) if not v.endswith(":ro")]
        for volume in stage.volumes:  # what the image writes outlives the container
            assert volume in named, f"{name}: {volume} is not a named volume"


def test_ingest_has_its_redis_url_and_the_orchestrator_defaults_to_local() -> None:
    services = compose()["services"]
    ingest = services["ingest"]["environment"]
    assert ingest["FRAMERELAY_INGEST_REDIS_URL"].startswith("redis://redis:")
    orch = {k: interpolate(str(v)) for k, v in services["orchestrator"]["environment"].items()}
    assert orch["FRAMERELAY_ORCH_PROVIDER"] == "local"
    assert orch["FRAMERELAY_ORCH_RUNPOD__API_KEY"] == ""


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_each_service_environment_loads_into_its_settings(name: str) -> None:
    env = {
        k: interpolate(str(v))
        for k, v in compose()["services"][name]["environment"].items()
        if not k.endswith("_FILE") and "TLS_" not in k  # secret files and certificates
    }  # that exist only inside the containers
    module, cls = SETTINGS[name].split(":")
    code = f"from {module} import {cls}\ns = {cls}()\nprint(getattr(s, 'provider', 'ok'))\n"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60,
        cwd=Path("/"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    if name == "orchestrator":
        assert proc.stdout.strip() == "local"
