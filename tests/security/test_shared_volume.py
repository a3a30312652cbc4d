"""A stolen pod cannot poison the pods that share its volume (issue 28, hole 3).

Real ``framerelay worker`` processes on 127.0.0.1 mount one temporary directory as their
network volume, with the environment the orchestrator gives a tier's pods
(:meth:`deploy.settings.TierVolume.worker_env`) and only the PUBLIC key set. The
operator signs the volume with the private key set (``framerelay volume sign``). Then
the test does what a pod that was taken over can do - write anything on the volume -
and starts the next worker:

- a replaced built artefact: refused in one log line, the worker builds its own copy;
- a replaced model file or model registry: the worker stops, in one line;
- a ``.pt`` (a pickle that would create a file when unpickled), even signed: refused,
  and the file is never created;
- a manifest the pod signs itself, or a token passed off as one: refused.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest

from deploy.settings import TierVolume
from framerelay.auth import KeySet
from framerelay.auth.keys import generate
from framerelay.auth.manifest import (
    AUD_VOLUME,
    MANIFEST_PATH,
    TYP,
    digest_tree,
    sign_manifest,
)
from framerelay.errors import ConfigError, ModelError
from framerelay.launcher import LocalWorker
from framerelay.model_registry import load_registry
from gpu_worker.detectors import OnnxDetectorSettings
from gpu_worker.detectors.base import acceleration_of
from gpu_worker.model_pool import ServedModel, detector_loader
from gpu_worker.volume import SharedVolume
from tests.conftest import MODEL, ROOT, TIMEOUT_FACTOR
from tests.support.auth import ed_keys, hs256_by_hand, mint
from tests.support.models import KITTI_STILL, write_registry

KEYS = ed_keys("vol-2026-12")
"""The primary cloud's private key set; workers get only its public half."""
GUIDE = (ROOT / "docs" / "runpod.md").read_text(encoding="utf-8")


def _volume(tmp_path: Path) -> Path:
    """A volume as the docs recommend: models, a registry, the artefact cache."""
    volume = tmp_path / "volume"
    (volume / "models").mkdir(parents=True)
    shutil.copy(MODEL, volume / "models" / MODEL.name)
    write_registry(volume / "models")
    return volume


def _sign(volume: Path, keys: KeySet = KEYS) -> None:
    """What ``framerelay volume sign VOLUME --keys keys.jwks`` does (tested below)."""
    path = volume / MANIFEST_PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(sign_manifest(digest_tree(volume), keys))


def _worker(volume: Path, name: str, model: Path, **env: str) -> LocalWorker:
    pod_env = TierVolume(local_dir=volume).worker_env(volume)  # what the orchestrator sets
    pod_env["FRAMERELAY_WORKER_TUNNEL_KEYS"] = KEYS.public().to_json()
    args = ["--model", str(model), "--threads", "1"]
    return LocalWorker(worker_id=name, args=args, env={**pod_env, **env})


def _info(worker: LocalWorker) -> dict[str, Any]:
    base = "http" + worker.url.removeprefix("ws").removesuffix("/v1/tunnel")
    token = mint(KEYS, f"worker:{worker.worker_id}", "worker")
    resp = httpx.get(f"{base}/info", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    resp.raise_for_status()
    body: dict[str, Any] = resp.json()
    return body


def _serve(worker: LocalWorker) -> tuple[dict[str, Any], str]:
    """Start ``worker``, read its ``/info``, stop it: (info, its log)."""
    worker.start(120 * TIMEOUT_FACTOR)
    try:
        info = _info(worker)
    finally:
        worker.stop()
    return info, worker.log_path.read_text(encoding="utf-8")


def _refusal(worker: LocalWorker) -> str:
    """The one line a worker that refuses to start says."""
    with pytest.raises(ConfigError, match=r"exited \(code 2\)") as err:
        worker.start(120 * TIMEOUT_FACTOR)
    said = str(err.value)
    assert "\n" not in said and "Traceback" not in worker.log_path.read_text(encoding="utf-8")
    return said


@pytest.mark.integration
def test_a_replaced_build_is_refused_and_the_next_worker_builds_its_own(tmp_path: Path) -> None:
    volume = _volume(tmp_path)
    model = volume / "models" / MODEL.name
    _sign(volume)
    first, _ = _serve(_worker(volume, "trusted-build", model))
    assert first["artefact_cache"] == "built"
    _sign(volume)  # the operator vouches for what the trusted build wrote
    entry = volume / "framerelay" / "cache" / "models" / str(first["artefact_key"])
    built = entry / "model.ort-optimized.onnx"
    assert built.is_file()
    # The stolen pod: another genuine model's graph in place of the signed build.
    built.write_bytes((volume / "models" / "vehicles.onnx").read_bytes())
    info, log = _serve(_worker(volume, "next-pod", model))
    assert info["artefact_cache"] == "built"  # its own copy, not the volume's
    refused = [line for line in log.splitlines() if "is refused" in line]
    assert len(refused) == 1, log[-2000:]
    assert str(entry) in refused[0]
    assert "model.ort-optimized.onnx does not match the volume's signed manifest" in refused[0]


@pytest.mark.integration
def test_a_replaced_model_or_registry_stops_the_next_worker_in_one_line(tmp_path: Path) -> None:
    volume = _volume(tmp_path)
    model, registry = volume / "models" / MODEL.name, volume / "models" / "models.toml"
    _sign(volume)
    original = model.read_bytes()
    model.write_bytes((volume / "models" / "vehicles.onnx").read_bytes())  # the stolen pod
    said = _refusal(_worker(volume, "pod-model", model))
    assert f"{model} is on the shared volume" in said
    assert f"{MODEL.name} does not match the volume's signed manifest" in said
    model.write_bytes(original)
    with registry.open("a", encoding="utf-8") as fh:  # the stolen pod adds a model of its own
        fh.write(_entry("evil", "vehicles.onnx"))
    env = {"FRAMERELAY_WORKER_MODEL_REGISTRY": str(registry)}
    said = _refusal(_worker(volume, "pod-registry", model, **env))
    assert f"{registry} is on the shared volume" in said
    assert "models.toml does not match the volume's signed manifest" in said


def _entry(name: str, file: str, fmt: str = "yolox") -> str:
    """A registry entry (TOML) for ``file``."""
    canary = f'{{ image = "{KITTI_STILL}", expect = {{ person = 1 }} }}'
    return (
        f'\n[models.{name}]\nfile = "{file}"\nformat = "{fmt}"\ninput_w = 416\n'
        f'input_h = 416\nclasses = ["person"]\nvram_mb = 1\ncanary = {canary}\n'
    )


def _payload(marker: Path) -> bytes:
    """A pickle that creates ``marker`` when it is loaded (the code a .pt can run)."""
    return f"cbuiltins\nopen\n(V{marker}\nVw\ntR.".encode()


def test_the_pickle_payload_runs_when_unpickled(tmp_path: Path) -> None:
    """The positive control of the next test: the payload is real."""
    marker = tmp_path / "ran"
    pickle.loads(_payload(marker)).close()  # noqa: S301 - our own payload, to prove it works
    assert marker.exists()


@pytest.mark.integration
def test_a_pickle_on_the_volume_is_never_unpickled_even_signed(tmp_path: Path) -> None:
    volume = _volume(tmp_path)
    marker = tmp_path / "pickle-ran"
    evil = volume / "models" / "best.pt"
    evil.write_bytes(_payload(marker))
    registry = write_registry(volume / "models", extra=_entry("evil", "best.pt", "ultralytics"))
    _sign(volume)  # signed: an operator signed a volume a stolen pod had written to
    said = _refusal(_worker(volume, "pod-pickle", evil))
    assert f"{evil} is on the shared volume" in said and "never loads a PyTorch file" in said
    gate = SharedVolume(volume, KEYS.public(), local_dir=tmp_path / "pod")
    entry = load_registry(registry, gate.read_bytes).get("evil")
    served = ServedModel(entry, detector_loader(OnnxDetectorSettings(model=MODEL), gate))
    with pytest.raises(ModelError, match="never loads a PyTorch file") as err:
        served.detector()
    assert "\n" not in str(err.value)
    assert not marker.exists()


def _forged(files: dict[str, Any]) -> dict[str, str]:
    """Manifests a stolen pod can make: it holds only the public key set."""
    kid = KEYS.kids[0]
    own = generate("EdDSA", kid)  # its own key, under the real key's name
    public = KEYS.public().get(kid)
    assert public is not None
    claims = {"iss": "framerelay", "aud": AUD_VOLUME, "iat": 1, "files": files}
    head = {"kid": kid, "typ": TYP}
    return {
        "own key": jwt.encode(claims, own.signing_key(), algorithm="EdDSA", headers=head),
        "a tunnel token": mint(KEYS, "worker:pod", "worker"),
        "unsigned": jwt.encode(claims, "", algorithm="none", headers=head),
        "HS256 with the public key": hs256_by_hand(claims, public.jwk["x"].encode(), head),
    }


@pytest.mark.parametrize(
    "kind", ["own key", "a tunnel token", "unsigned", "HS256 with the public key"]
)
def test_a_manifest_the_stolen_pod_makes_is_refused(tmp_path: Path, kind: str) -> None:
    volume = _volume(tmp_path)
    model = volume / "models" / MODEL.name
    model.write_bytes((volume / "models" / "vehicles.onnx").read_bytes())
    files = {rel: d.as_json() for rel, d in digest_tree(volume).items()}
    (volume / MANIFEST_PATH).parent.mkdir(parents=True)
    (volume / MANIFEST_PATH).write_text(_forged(files)[kind])
    gate = SharedVolume(volume, KEYS.public(), local_dir=tmp_path / "pod")
    with pytest.raises(ModelError, match="is not used") as err:
        gate.model_file(model)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "pod" / "models").exists()  # nothing copied for the detector


def test_a_file_the_manifest_does_not_list_is_refused(tmp_path: Path) -> None:
    volume = _volume(tmp_path)
    _sign(volume)
    planted = volume / "models" / "planted.onnx"
    shutil.copy(MODEL, planted)
    gate = SharedVolume(volume, KEYS.public(), local_dir=tmp_path / "pod")
    with pytest.raises(ModelError, match="signed manifest does not list it"):
        gate.model_file(planted)
    assert gate.model_file(volume / "models" / MODEL.name).read_bytes() == MODEL.read_bytes()
    assert gate.model_file(MODEL) == MODEL  # off the volume: the worker's own file


def test_the_local_dir_may_not_be_on_the_volume(tmp_path: Path) -> None:
    from gpu_worker.settings import WorkerSettings

    with pytest.raises(ConfigError, match="VOLUME_LOCAL_DIR is on the shared volume"):
        WorkerSettings(volume_dir=tmp_path, volume_local_dir=tmp_path / "local")


def _guide_commands() -> list[str]:
    section = GUIDE.split("## Network volumes", 1)[1].split("\n## ", 1)[0]
    block = section.split("<!-- tested: tests/security/test_shared_volume.py -->\n```bash\n")[1]
    lines = block.split("```", 1)[0].splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def test_the_guide_commands_sign_and_verify_a_volume(tmp_path: Path) -> None:
    """docs/runpod.md's signing commands (docs/security.md#shared-volumes), as written."""
    volume = _volume(tmp_path)
    (tmp_path / "keys.jwks").write_text(KEYS.to_json())
    (tmp_path / "workers.jwks").write_text(KEYS.public().to_json())
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "framerelay"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m framerelay "$@"\n')
    shim.chmod(0o755)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    env["PYTHONPATH"] = str(ROOT)
    script = "set -euo pipefail\n" + "\n".join(_guide_commands()) + "\n"
    proc = subprocess.run(
        ["/bin/bash", "-c", script],
        cwd=tmp_path,
        env=env,
        text=True,
        capture_output=True,
        timeout=120 * TIMEOUT_FACTOR,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"ok\tmodels/{MODEL.name}" in proc.stdout and "unsigned" not in proc.stdout
    gate = SharedVolume(volume, KEYS.public(), local_dir=tmp_path / "pod")
    assert set(gate.manifest().files) == set(digest_tree(volume))
    (volume / MANIFEST_PATH).write_text((tmp_path / "manifest.jwt").read_text())
    assert set(gate.manifest().files) == set(digest_tree(volume))  # from the digest list


def test_a_fifo_in_place_of_a_signed_file_is_refused_without_hanging(tmp_path: Path) -> None:
    """A reader opening a FIFO the stolen pod put there would wait for ever."""
    volume = _volume(tmp_path)
    _sign(volume)
    model = volume / "models" / MODEL.name
    model.unlink()
    os.mkfifo(model)
    gate = SharedVolume(volume, KEYS.public(), local_dir=tmp_path / "pod")
    with pytest.raises(ModelError, match="is not a regular file"):
        gate.model_file(model)
    (volume / MANIFEST_PATH).unlink()
    os.mkfifo(volume / MANIFEST_PATH)
    with pytest.raises(ConfigError, match="is not a regular file"):
        gate.read_bytes(volume / "models" / "models.toml", 1024)


def test_a_build_is_never_written_through_a_link_off_the_volume(tmp_path: Path) -> None:
    volume, outside = _volume(tmp_path), tmp_path / "pod-b-home"
    _sign(volume)
    outside.mkdir()
    (volume / "framerelay" / "cache").mkdir(parents=True)
    (volume / "framerelay" / "cache" / "models").symlink_to(outside)  # the stolen pod
    gate = SharedVolume(volume, KEYS.public(), local_dir=tmp_path / "pod")
    cache = volume / "framerelay" / "cache"
    model = volume / "models" / MODEL.name
    detector = gate.load_detector(OnnxDetectorSettings(model=model, cache_dir=cache, threads=1))
    assert acceleration_of(detector).artefact_cache == "built"
    assert list(outside.iterdir()) == []
