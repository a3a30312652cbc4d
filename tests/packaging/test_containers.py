"""Container images by their contract (see containers.py for how, without Docker).

Each Dockerfile's final stage is read (dockerfile.py); its promises are checked
(non-root numeric USER, the wheel installed, exposed ports = default ports,
a TLS-aware HEALTHCHECK, writable paths declared as VOLUMEs) and its commands
run against the wheel install under the same uid on a read-only root until
its own HEALTHCHECK passes. The ingest of the services image accepts
``POST /v1/streams`` (it answered 503 "cannot write the stream store" when its
working directory was root-owned); the CUDA worker runs with TLS on (on CPU
here: ONNX Runtime falls back) and its health check still passes.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import trustme

from tests.conftest import REDIS_URL, TIMEOUT_FACTOR
from tests.packaging import containers
from tests.packaging.dockerfile import DockerIgnore, Stage, parse
from tests.packaging.wheel_env import ROOT, InstalledWheel
from tests.support.servers import free_port

DOCKER = ROOT / "deploy" / "docker"
IMAGES = ("worker-cpu", "worker-cuda", "service")
SECRET = "container-contract-secret-0123456789abcdef"
STORE = "FRAMERELAY_INGEST_STORE_PATH"


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix of its own on the shared Redis, its keys deleted afterwards."""
    prefix = f"test-containers-{secrets.token_hex(4)}"
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def stage(name: str) -> Stage:
    return parse(DOCKER / f"{name}.Dockerfile")


@pytest.mark.parametrize("name", IMAGES)
def test_dockerfile_promises(name: str) -> None:
    s = stage(name)
    uid, gid = s.uid_gid
    assert uid != 0 and gid != 0, "runs as root"
    assert s.entrypoint == ["framerelay"] and s.cmd
    assert any("/wheels/framerelay-*.whl" in r for r in s.run), "installs the wheel"
    assert not [c for c in s.copy if not c.startswith("--from=")], "only build outputs copied"
    assert "framerelay.healthcheck" in " ".join(s.healthcheck)
    assert s.healthcheck_options.get("start-period")
    ports = {int(v) for k, v in s.env.items() if k.endswith("_PORT")} or {8080, 8090}
    assert set(s.expose) == ports
    for key, value in s.env.items():  # every writable path the image names lies in a VOLUME
        if key == STORE or key.endswith(("_DIR", "_OUT_DIR")):
            assert any(value.startswith(v) for v in s.volumes), f"{key}={value} is not writable"


def test_cuda_worker_has_the_tensorrt_runtime_and_an_engine_cache_volume() -> None:
    s = stage("worker-cuda")
    install = " ".join(s.run)
    assert '"onnxruntime-gpu==${ORT_VERSION}" "${TENSORRT_SPEC}"' in install
    assert s.args["ORT_VERSION"] and s.args["TENSORRT_SPEC"].startswith("tensorrt-cu12-libs")
    assert s.env["FRAMERELAY_WORKER_DETECTOR__ENGINE_CACHE_DIR"] in s.volumes
    assert not [k for k in s.env if k.startswith("ORT_TENSORRT_")], "ignored beside options"
    assert s.env["LD_LIBRARY_PATH"] == "/opt/tensorrt_libs"


FIRST_CUDA13_ORT = (1, 27)
"""onnxruntime-gpu on PyPI: built for CUDA 12 up to 1.26, for CUDA 13 from 1.27 (read off the
wheels' libonnxruntime_providers_cuda.so, which needs libcublas.so.12 / .13)."""


def _cuda_of_ort(version: str) -> int:
    major, minor = (int(p) for p in version.split(".")[:2])
    return 13 if (major, minor) >= FIRST_CUDA13_ORT else 12


def test_cuda_image_ort_tensorrt_and_extras_share_one_cuda_major() -> None:
    """The shipped image pinned onnxruntime-gpu 1.31.1 (CUDA 13) on a CUDA 12.8 base: its
    CUDA provider could not load. Every pin must name the same CUDA major."""
    import tomllib

    s = stage("worker-cuda")
    cuda = _cuda_of_ort(s.args["ORT_VERSION"])
    assert s.base.startswith(f"nvidia/cuda:{cuda}."), (s.base, s.args["ORT_VERSION"])
    assert s.args["TENSORRT_SPEC"].startswith(f"tensorrt-cu{cuda}-libs")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    gpu = " ".join(extras["optional-dependencies"]["gpu"])
    assert f"nvidia-nvimgcodec-cu{cuda}" in gpu and "onnxruntime-gpu>=1.17,<1.27" in gpu
    cu13 = " ".join(extras["optional-dependencies"]["gpu-cu13"])
    assert "nvidia-nvimgcodec-cu13" in cu13 and "onnxruntime-gpu>=1.27" in cu13
    check = (ROOT / "scripts" / "gpu-check.sh").read_text()
    libs = next(line for line in check.splitlines() if line.startswith("CUDA_LIBS="))
    assert all(f"-cu{cuda}" in name for name in libs.split('"')[1].split()), libs


def test_services_image_carries_no_kubectl() -> None:
    """The orchestrator's Kubernetes provider talks to the API server with lightkube: no
    kubectl binary to download, pin and patch in the image."""
    install = " ".join(stage("service").run)
    assert "kubectl" not in install and "dl.k8s.io" not in install


def test_dockerignore_sends_only_the_sources() -> None:
    ignore = DockerIgnore((ROOT / ".dockerignore").read_text())
    for path in (
        ".venv/bin/python",
        ".git/HEAD",
        "framerelay/__pycache__/cli.cpython-311.pyc",
        ".mypy_cache/x.json",
        ".pytest_cache/v",
        "tests/conftest.py",
        "secrets/a.jwks",
        "samples/mot15/TUD-Campus/TUD-Campus.mp4",
        "framerelay.egg-info/PKG-INFO",
    ):
        assert ignore.excluded(path), path
    context = ignore.context(ROOT)
    assert "framerelay/cli.py" in context and "pyproject.toml" in context
    assert not [p for p in context if p.startswith((".venv", ".git/")) or "__pycache__" in p]
    size = sum((ROOT / p).stat().st_size for p in context)
    assert size < 20 << 20, f"context of {size / 1e6:.0f} MB"


def _readonly(container: containers.Container, installed: InstalledWheel) -> None:
    for path in (installed.site / "probe", "/var/tmp/probe", "/etc/probe"):
        assert container.exec(["touch", str(path)]).returncode != 0, f"{path} is writable"
    for volume in (*container.stage.volumes, "/tmp"):
        assert container.exec(["touch", f"{volume}/probe"]).returncode == 0, volume


@pytest.mark.parametrize(("name", "tls"), [("worker-cpu", False), ("worker-cuda", True)])
def test_worker_image_runs_and_its_healthcheck_passes(
    installed_wheel: InstalledWheel, name: str, tls: bool
) -> None:
    s = stage(name)
    extra = {"FRAMERELAY_TOKEN_SECRETS": SECRET, "FRAMERELAY_WORKER_PORT": str(free_port())}
    ca = trustme.CA()
    if tls:
        cert = ca.issue_cert("worker")
        extra["FRAMERELAY_WORKER_TLS_CERT_PEM"] = cert.cert_chain_pems[0].bytes().decode()
        extra["FRAMERELAY_WORKER_TLS_KEY_PEM"] = cert.private_key_pem.bytes().decode()
    env = containers.container_env(s, installed_wheel, **extra)
    with containers.run(s, installed_wheel, env) as box:
        health = box.wait_healthy(90 * TIMEOUT_FACTOR)
        assert health.returncode == 0, health.stderr + box.output()
        scheme = "https" if tls else "http"
        assert f"{scheme}://127.0.0.1:{extra['FRAMERELAY_WORKER_PORT']}/readyz" in health.stdout
        _readonly(box, installed_wheel)
        if tls:
            _pod_ca_check(box, installed_wheel, ca, extra["FRAMERELAY_WORKER_PORT"])


def _pod_ca_check(
    box: containers.Container, installed: InstalledWheel, ca: trustme.CA, port: str
) -> None:
    """compose's worker check: the certificate must chain to the pod CA given."""
    good, bad = installed.venv.parent / f"ca-{port}.pem", installed.venv.parent / f"x-{port}.pem"
    ca.cert_pem.write_to_path(str(good))
    trustme.CA().cert_pem.write_to_path(str(bad))
    check = ["python", "-m", "framerelay.healthcheck", port, "/readyz", "--ca"]
    assert box.exec([*check, str(good)]).returncode == 0
    refused = box.exec([*check, str(bad)])
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "CERTIFICATE_VERIFY_FAILED" in refused.stderr


def _token() -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "framerelay", "token", "mint", "--scope", "streams:write",
         "--aud", "ingest"],
        env={"FRAMERELAY_TOKEN_SECRETS": SECRET, "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return proc.stdout.strip()


def test_services_image_ingest_stores_streams_added_over_the_api(
    installed_wheel: InstalledWheel,
) -> None:
    s = stage("service")
    port = free_port()
    env = containers.container_env(
        s, installed_wheel, FRAMERELAY_TOKEN_SECRETS=SECRET, FRAMERELAY_INGEST_API_PORT=str(port)
    )
    argv = [*s.entrypoint, "ingest", "--worker-url", "ws://127.0.0.1:9/v1/tunnel"]
    with containers.run(s, installed_wheel, env, argv) as box:
        health = box.wait_healthy(60 * TIMEOUT_FACTOR)
        assert health.returncode == 0, health.stderr + box.output()
        body = json.dumps({"id": "cam-1", "url": "rtsp://127.0.0.1:9/none"}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/streams", data=body, method="POST",
            headers={"Authorization": f"Bearer {_token()}", "Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310 (loopback)
            assert resp.status == 201
        stored = box.exec(["cat", s.env[STORE]])
        assert stored.returncode == 0 and "cam-1" in stored.stdout, stored.stderr
        _readonly(box, installed_wheel)


def test_services_image_orchestrator_runs_with_the_local_provider(
    installed_wheel: InstalledWheel, redis_prefix: str
) -> None:
    s = stage("service")
    tiers = [{"name": "ondemand", "min_warm": 0, "max_workers": 1}]
    env = containers.container_env(
        s, installed_wheel,
        FRAMERELAY_TOKEN_SECRETS=SECRET,
        FRAMERELAY_ORCH_PORT=str(free_port()),
        FRAMERELAY_ORCH_REDIS_URL=REDIS_URL,
        FRAMERELAY_ORCH_KEY_PREFIX=f"{redis_prefix}:",
        FRAMERELAY_ORCH_TIERS=json.dumps(tiers),
    )  # fmt: skip
    with containers.run(s, installed_wheel, env) as box:
        health = box.wait_healthy(60 * TIMEOUT_FACTOR)
        assert health.returncode == 0, health.stderr + box.output()
        assert Path(s.env["FRAMERELAY_ORCH_CA_DIR"]).parent.as_posix() in s.volumes


def test_services_image_recorder_writes_its_volume(
    installed_wheel: InstalledWheel, redis_prefix: str
) -> None:
    s = stage("service")
    clip = installed_wheel.site / "framerelay" / "_data" / "TUD-Stadtmitte.mp4"
    env = containers.container_env(
        s, installed_wheel,
        FRAMERELAY_REDIS_URL=REDIS_URL,
        FRAMERELAY_RECORD_REDIS_PREFIX=redis_prefix,
        FRAMERELAY_RECORD_REALTIME="false",
    )  # fmt: skip
    record = [*s.entrypoint, "record", "--stream", "cam-1", "--source", str(clip)]
    listing = f"ls -R {s.env['FRAMERELAY_RECORD_OUT_DIR']}"  # before the tmpfs goes
    argv = ["/bin/sh", "-c", f'"$@" && {listing}', "sh", *record]
    with containers.run(s, installed_wheel, env, argv) as box:
        assert box.proc.wait(timeout=90 * TIMEOUT_FACTOR) == 0, box.output()
        assert ".mp4" in box.output(), box.output()
