"""Each loaded model is checked by its own canary (issue 17), with real components: a real
worker (in this process, loopback) hosting the shipped COCO model and a real second
model derived from it ("vehicles": car, bus, truck), and the orchestrator's prober.

* the vehicles model passes its own canary (a car on frame 1 of KITTI-17) by real
  inference, and fails the COCO expectation (persons) it has no class for;
* a probe checks the default model (persons) and every other loaded model against its
  registry entry, and fails, saying which model saw what, when one falls short.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.health import Canary, CanaryCheck, Probe, WorkerProber, loaded_models
from deploy.pod_trust import PodTrust
from deploy.service import make_prober
from framerelay.data import CANARY_STILL
from framerelay.errors import ConfigError
from framerelay.model_registry import load_registry
from tests.support.auth import ed_keys
from tests.support.models import write_registry
from tests.support.orchestrator import orch_settings
from tests.support.worker_harness import running_worker, token

pytestmark = pytest.mark.integration


async def _with_worker(
    secret: str, registry_file: Path, orch_registry: Path, checks: list[CanaryCheck]
) -> tuple[list[str | None], Probe]:
    canary = Canary(registry=load_registry(orch_registry), timeout_s=30)
    prober = WorkerProber(canary, lambda name: token(secret), heartbeat_timeout_s=10)
    try:
        async with running_worker(secret, model_registry=registry_file) as (_, url):
            http = url.replace("ws://", "http://").removesuffix("/v1/tunnel")
            said = [await prober.check_model(url, token(secret), c) for c in checks]
            return said, await prober.probe("gpu-a", url, http, canary=True)
    finally:
        await prober.aclose()


async def test_a_non_coco_model_passes_its_own_canary(secret: str, tmp_path: Path) -> None:
    registry_file = write_registry(tmp_path)
    vehicles = CanaryCheck.of(load_registry(registry_file).get("vehicles"))
    as_coco = CanaryCheck("vehicles", CANARY_STILL, {"person": 3})
    said, probe = await _with_worker(secret, registry_file, registry_file, [vehicles, as_coco])
    assert said[0] is None  # at least one car above 0.5 on the KITTI-17 still
    assert said[1] == "canary of model vehicles saw 0 person, expected >= 3 person"
    assert probe.canary_ok is True and probe.error is None, probe
    assert probe.models == ("vehicles",) and probe.persons >= 3


async def test_a_probe_fails_when_a_loaded_model_misses_its_expectation(
    secret: str, tmp_path: Path
) -> None:
    registry_file = write_registry(tmp_path)
    strict = tmp_path / "orch"
    strict.mkdir()
    orch_registry = write_registry(strict)
    orch_registry.write_text(orch_registry.read_text().replace("car = 1", "car = 4"))
    vehicles = CanaryCheck.of(load_registry(registry_file).get("vehicles"))
    said, probe = await _with_worker(secret, registry_file, orch_registry, [vehicles])
    assert said == [None]  # the worker's registry expectation: met (it loads the model)
    assert probe.canary_ok is False and probe.models == ("vehicles",)
    assert probe.error == "canary of model vehicles saw 1 car, expected >= 4 car"


@pytest.mark.parametrize(
    ("info", "names"),
    [
        ({"capacity_fps": 3}, ()),
        ({"default_model": "a", "models": [{"name": "a", "loaded": True}]}, ()),
        ({"models": [{"name": "b", "loaded": False}, {"name": "c", "loaded": True}]}, ("c",)),
        ({"models": [{"name": "bad name", "loaded": True}, {"name": 3, "loaded": True}]}, ()),
        ({"models": "x"}, ()),
    ],
)
def test_loaded_models_reads_info_tolerantly(info: dict[str, object], names: tuple[str]) -> None:
    assert loaded_models(info) == names


async def test_the_orchestrator_reads_its_registry_for_the_canaries(tmp_path: Path) -> None:
    registry_file = write_registry(tmp_path)
    settings = orch_settings(tmp_path, model_registry=registry_file)
    trust = PodTrust(ed_keys())
    prober = make_prober(settings, trust)
    try:
        check = prober.canary.check_for("vehicles")
        assert check is not None and check.expect == {"car": 1} and check.min_confidence == 0.5
        assert prober.canary.check_for("ppe") is None
    finally:
        await prober.aclose()
    bad = tmp_path / "bad.toml"
    bad.write_text("[models.v]\n")
    with pytest.raises(
        ConfigError, match=r"bad\.toml: models\.v: give exactly one of 'file' and 'uri'"
    ):
        make_prober(orch_settings(tmp_path, model_registry=bad), trust)
