"""Acceptance (issue 17): the second worker on the same volume starts faster and does
not rebuild.

Real ``framerelay worker`` processes share a temporary directory as their "network
volume" (``FRAMERELAY_WORKER_VOLUME_DIR``): the model file is read from it, and the
artefact cache lives on it. On this machine (CPU provider) the built artefact is ONNX
Runtime's optimised model (the prepared graph on GPU providers, with TensorRT's engines
beside it). The volume is signed (issue 28: a worker takes from it only what its signed
manifest lists); the first worker builds and writes its build there, the operator signs
again, and the second finds it (its log says so, ``/info`` says ``hit``, the files are
not rewritten); its start-to-ready time is printed beside the first's. What happens to
a volume a stolen pod wrote is tests/security/test_shared_volume.py's.
"""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from framerelay.auth.manifest import MANIFEST_PATH, digest_tree, sign_manifest
from framerelay.geometry import Letterbox
from framerelay.launcher import LocalWorker
from gpu_worker.artefact_cache import ArtefactCache, artefact_key, build_lock, write_atomic
from gpu_worker.detectors import ModelInput, OnnxDetectorSettings, load_detector
from tests.conftest import MODEL, TIMEOUT_FACTOR
from tests.support.auth import hs_keys, mint

SECRET = "engine-cache-test-secret-0123456789"


def _sign(volume: Path) -> None:
    """The operator signs the volume (``framerelay volume sign``; HS256 on one host)."""
    (volume / MANIFEST_PATH).parent.mkdir(parents=True, exist_ok=True)
    (volume / MANIFEST_PATH).write_text(sign_manifest(digest_tree(volume), hs_keys(SECRET)))


def _start(volume: Path, name: str) -> tuple[LocalWorker, float]:
    env = {"FRAMERELAY_WORKER_DETECTOR__CACHE_DIR": str(volume / "cache")}
    env["FRAMERELAY_WORKER_VOLUME_DIR"] = str(volume)
    args = ["--model", str(volume / "models" / MODEL.name), "--threads", "1"]
    worker = LocalWorker(SECRET, worker_id=name, args=args, env=env)
    started = time.perf_counter()
    worker.start(120 * TIMEOUT_FACTOR)
    return worker, time.perf_counter() - started


def _info(worker: LocalWorker) -> dict[str, Any]:
    base = "http" + worker.url.removeprefix("ws").removesuffix("/v1/tunnel")
    auth = {"Authorization": f"Bearer {mint(SECRET, f'worker:{worker.worker_id}', 'worker')}"}
    resp = httpx.get(f"{base}/info", headers=auth, timeout=10)
    resp.raise_for_status()
    body: dict[str, Any] = resp.json()
    return body


def _load_s(log: str, what: str) -> float:
    """The model load time the worker logged (``... <what> the artefact cache <dir> in
    N s``)."""
    line = next(ln for ln in log.splitlines() if f"{what} the artefact cache" in ln)
    return float(line.rsplit(" in ", 1)[1].split()[0])


def _entries(volume: Path) -> dict[str, float]:
    return {str(p.relative_to(volume)): p.stat().st_mtime_ns
            for p in (volume / "cache").rglob("*") if p.is_file()}  # fmt: skip


@pytest.mark.integration
def test_second_worker_on_the_volume_starts_from_the_cache(tmp_path: Path) -> None:
    volume = tmp_path / "volume"
    (volume / "models").mkdir(parents=True)
    shutil.copy(MODEL, volume / "models" / MODEL.name)  # the model, from the volume
    _sign(volume)
    first, first_s = _start(volume, "first")
    try:
        first_info = _info(first)
        built = _entries(volume)
    finally:
        first.stop()
    _sign(volume)  # the operator vouches for the first worker's build
    second, second_s = _start(volume, "second")
    try:
        second_info = _info(second)
    finally:
        second.stop()
    first_load = _load_s(first.log_path.read_text(), "built and stored in")
    second_load = _load_s(second.log_path.read_text(), "found in")
    print(f"\nworker start -> ready on a shared volume: first (builds) {first_s:.2f} s, "
          f"second (cache hit) {second_s:.2f} s; model load {first_load:.2f} s -> "
          f"{second_load:.2f} s")  # fmt: skip
    assert first_info["artefact_cache"] == "built"
    assert second_info["artefact_cache"] == "hit"
    assert first_info["artefact_key"] == second_info["artefact_key"]
    assert any(name.endswith("model.ort-optimized.onnx") for name in built), built
    assert _entries(volume) == built  # nothing rewritten: the second did not rebuild
    # The times are printed, not asserted (a timed assertion fails on a loaded CI
    # machine: 4.7 s against 3.5 s once): the cache hit is asserted above; the speed-up
    # is a figure (model load 0.29 -> 0.03 s here; the whole start is dominated by
    # imports and the warm-up benchmark on a CPU).


def _detector(cache: Path, **fields: Any) -> Any:
    return load_detector(OnnxDetectorSettings(model=MODEL, cache_dir=cache, threads=1, **fields))


def test_a_cached_model_gives_the_same_detections(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    image = rng.integers(0, 255, (416, 416, 3), dtype=np.uint8)
    batch = [ModelInput(image, Letterbox(416, 416, 416, 416, 1.0))] * 2
    built, hit = _detector(tmp_path), _detector(tmp_path)
    assert (built.acceleration.artefact_cache, hit.acceleration.artefact_cache) == ("built", "hit")
    assert (hit.format, hit.class_names, hit.input_size) == (
        built.format, built.class_names, built.input_size)  # fmt: skip
    for a, b in zip(built.infer(batch), hit.infer(batch), strict=True):
        np.testing.assert_allclose(a.xyxy, b.xyxy, atol=1e-3)


@pytest.mark.parametrize(
    "change", [{"max_batch": 1}, {"confidence_threshold": 0.5}, {"in_graph_post": "on"}]
)
def test_another_setting_gets_another_entry(tmp_path: Path, change: dict[str, Any]) -> None:
    first = _detector(tmp_path)
    other = _detector(tmp_path, **change)
    assert other.acceleration.artefact_cache == "built"
    assert other.acceleration.artefact_key != first.acceleration.artefact_key


def test_a_half_written_entry_is_a_miss(tmp_path: Path) -> None:
    """Only meta.json (written last) completes an entry; a torn or garbled one is built
    again, never read."""
    first = _detector(tmp_path)
    folder = tmp_path / "models" / first.acceleration.artefact_key
    (folder / "meta.json").write_text("{not json")
    again = _detector(tmp_path)
    assert again.acceleration.artefact_cache == "built"
    assert json.loads((folder / "meta.json").read_text())["kind"].endswith(".onnx")


def test_a_damaged_artefact_is_built_again(tmp_path: Path) -> None:
    first = _detector(tmp_path)
    folder = tmp_path / "models" / first.acceleration.artefact_key
    (folder / "model.ort-optimized.onnx").write_bytes(b"not a model")
    again = _detector(tmp_path)
    assert again.acceleration.artefact_cache == "built"
    assert _detector(tmp_path).acceleration.artefact_cache == "hit"


def test_workers_starting_together_both_serve_and_leave_one_complete_entry(
    tmp_path: Path,
) -> None:
    """No lock on the CPU artefact: both build, each rename is atomic, the entry is whole."""
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda _: _detector(tmp_path), range(2))
    assert a.acceleration.artefact_key == b.acceleration.artefact_key
    assert {a.acceleration.artefact_cache, b.acceleration.artefact_cache} <= {"built", "hit"}
    folder = tmp_path / "models" / a.acceleration.artefact_key
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "model.ort-optimized.onnx"]
    assert _detector(tmp_path).acceleration.artefact_cache == "hit"


def test_atomic_write_leaves_no_temp_files(tmp_path: Path) -> None:
    write_atomic(tmp_path / "a.bin", b"x" * 10)
    write_atomic(tmp_path / "a.bin", b"y" * 10)
    assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]
    assert (tmp_path / "a.bin").read_bytes() == b"y" * 10


def test_keys_are_digests_of_their_facts() -> None:
    a = artefact_key({"model_sha256": "ab", "gpu": "NVIDIA L4"})
    assert a == artefact_key({"gpu": "NVIDIA L4", "model_sha256": "ab"})
    assert a != artefact_key({"model_sha256": "ab", "gpu": "NVIDIA A10"})
    assert len(a) == 32 and a.isalnum()


def test_build_lock_is_exclusive_and_times_out(tmp_path: Path) -> None:
    with build_lock(tmp_path, 1.0) as taken:
        assert taken
        started = time.monotonic()
        with build_lock(tmp_path, 0.3) as second:  # another open file: flock conflicts
            assert not second
        assert time.monotonic() - started >= 0.3
    with build_lock(tmp_path, 0.3) as again:
        assert again


def test_an_unwritable_cache_is_a_one_line_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    from framerelay.errors import ConfigError

    with pytest.raises(ConfigError, match="CACHE_DIR") as err:
        ArtefactCache(blocker / "cache").prepare()
    assert "\n" not in str(err.value)


@pytest.mark.gpu
def test_tensorrt_engines_are_built_once_per_key(tmp_path: Path) -> None:
    """On a GPU: the first detector builds TensorRT engines into ``<cache>/trt/<key>``;
    the second finds its prepared graph and the engines, and rewrites none."""
    import onnxruntime as ort

    if "TensorrtExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime has no TensorRT provider (install onnxruntime-gpu)")
    started = time.perf_counter()
    first = _detector(tmp_path, providers="tensorrt", max_batch=4)
    cold_s = time.perf_counter() - started
    if first.providers[0] != "TensorrtExecutionProvider":
        pytest.skip(f"TensorRT did not load; providers {first.providers}")
    engines = tmp_path / "trt" / first.acceleration.artefact_key
    built = {p.name: p.stat().st_mtime_ns for p in engines.iterdir()}
    assert any(n.endswith(".engine") for n in built), built
    started = time.perf_counter()
    second = _detector(tmp_path, providers="tensorrt", max_batch=4)
    warm_s = time.perf_counter() - started
    print(f"\nTensorRT detector load: first (builds) {cold_s:.2f} s, second {warm_s:.2f} s")
    assert second.acceleration.artefact_cache == "hit"
    assert {p.name: p.stat().st_mtime_ns for p in engines.iterdir()} == built
    assert warm_s < cold_s
