"""Several models on one worker (issue 17), with real components: the worker in this
process on a loopback port, the real ingest tunnel client, the real COCO model and a
real second model derived from it ("vehicles": car, bus, truck).

* two models on one worker, a stream on each: every result names its model, and the
  vehicles stream's detections are named by the vehicles classes;
* a stream naming a model the worker does not know is refused, and the stream says why;
* a stream naming a model that is not loaded makes the worker load it (on demand);
* the VRAM budget: a model that does not fit while the others have streams is refused
  with the reason; once their streams are gone the least recently used one is evicted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from framerelay.results import ResultRecord
from gpu_worker.server import Worker
from ingest.settings import StreamConfig
from tests.conftest import CLIP, TIMEOUT_FACTOR
from tests.support.cli_runs import clean_env, run_all
from tests.support.models import VEHICLE_CLASSES, write_registry
from tests.support.waiting import wait_until_async
from tests.support.worker_harness import running_worker, streaming, token

WAIT_S = 60 * TIMEOUT_FACTOR
pytestmark = pytest.mark.integration


def _config(sid: str, model: str | None = None) -> StreamConfig:
    return StreamConfig(id=sid, url=str(CLIP), fps=5, realtime=True, loop=True, model=model)


def _loaded(worker: Worker) -> dict[str, bool]:
    return {m.name: m.loaded is not None for m in worker.models.models.values()}


async def test_two_models_on_one_worker_results_carry_the_model_name(
    secret: str, tmp_path: Path
) -> None:
    registry = write_registry(tmp_path)
    records: list[ResultRecord] = []
    scraped: list[str] = []

    async with running_worker(secret, model_registry=registry) as (worker, url):
        before = _loaded(worker)
        async with (
            streaming(url, token(secret), records, _config("people")),
            streaming(url, token(secret), records, _config("cars", "vehicles")),
        ):
            await wait_until_async(
                lambda: {r.stream_id for r in records} >= {"people", "cars"},
                WAIT_S,
                "results of both streams",
            )
            await wait_until_async(lambda: len(records) >= 10, WAIT_S, "more results")
            scraped.append(worker.metrics.render().decode())
            during = _loaded(worker)
    assert before == {"yolox_nano": True}
    assert during == {"yolox_nano": True, "vehicles": True}
    by_stream = {sid: [r for r in records if r.stream_id == sid] for sid in ("people", "cars")}
    assert {r.model for r in by_stream["people"]} == {"yolox_nano"}
    assert {r.model for r in by_stream["cars"]} == {"vehicles"}
    people = {d.class_name for r in by_stream["people"] for d in r.detections}
    assert "person" in people  # the COCO model finds the clip's pedestrians
    cars = {d.class_name for r in by_stream["cars"] for d in r.detections}
    assert cars <= set(VEHICLE_CLASSES)  # named by the vehicles model's own classes
    metrics = scraped[0].splitlines()
    for line in ('framerelay_worker_model_loaded{model="vehicles"} 1.0',
                 'framerelay_worker_model_streams{model="vehicles"} 1.0',
                 'framerelay_worker_model_streams{model="yolox_nano"} 1.0',
                 'framerelay_worker_model_vram_bytes{model="vehicles"} 3.145728e+08',
                 "framerelay_worker_model_evictions_total 0.0"):  # fmt: skip
        assert line in metrics, line


async def test_an_unknown_model_is_refused_and_the_stream_says_why(
    secret: str, tmp_path: Path
) -> None:
    registry = write_registry(tmp_path)

    async with (
        running_worker(secret, model_registry=registry) as (_, url),
        streaming(url, token(secret), [], _config("cam", "ppe")) as (_, stream),
    ):
        await wait_until_async(lambda: stream.last_error is not None, WAIT_S, "the stream's error")
        await wait_until_async(lambda: stream.error is not None, WAIT_S, "the stream failing")
        last, error = stream.last_error, stream.error
    said = (
        "the worker refused the stream: unknown_model: unknown model 'ppe'; "
        "the registry has vehicles, yolox_nano"
    )
    assert last == said and error is not None and said in error


async def test_a_model_that_does_not_fit_is_refused_then_the_lru_one_is_evicted(
    secret: str, tmp_path: Path
) -> None:
    extra = """
[models.vehicles2]
file = "vehicles.onnx"
format = "yolox"
input_w = 416
input_h = 416
classes = ["car", "bus", "truck"]
vram_mb = 300
canary = { image = "vehicles.onnx", expect = { car = 1 } }
"""
    registry = write_registry(tmp_path, extra=extra)
    records: list[ResultRecord] = []

    async with running_worker(secret, model_registry=registry, vram_budget_mb=600) as (
        worker,
        url,
    ):
        async with streaming(url, token(secret), records, _config("a", "vehicles")):
            await wait_until_async(lambda: bool(records), WAIT_S, "a result of vehicles")
            async with streaming(url, token(secret), [], _config("b", "vehicles2")) as (
                _,
                refused,
            ):
                await wait_until_async(lambda: refused.last_error is not None, WAIT_S, "refusal")
                said = refused.last_error
        with_a = _loaded(worker)
        async with streaming(url, token(secret), records, _config("b", "vehicles2")):
            await wait_until_async(lambda: any(r.stream_id == "b" for r in records), WAIT_S, "b")
            after = _loaded(worker)
    assert said == (
        "the worker refused the stream: model_capacity: model vehicles2 needs 300 MiB; "
        "44 of 600 MiB are free and every other model has streams"
    )
    assert with_a == {"yolox_nano": True, "vehicles": True}
    assert after == {"yolox_nano": True, "vehicles2": True}  # vehicles evicted (LRU, idle)
    assert {r.model for r in records if r.stream_id == "b"} == {"vehicles2"}


def test_a_bad_registry_stops_the_worker_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "models.toml"
    bad.write_text('[models.v]\nfile = "v.onnx"\nvram_mb = -1\n')
    env = clean_env(FRAMERELAY_TOKEN_SECRETS="s" * 40, FRAMERELAY_WORKER_PORT="0")
    runs = run_all([
        (["worker"], env | {"FRAMERELAY_WORKER_MODEL_REGISTRY": str(bad)}),
        (["worker"], env | {"FRAMERELAY_WORKER_MODEL_REGISTRY": str(tmp_path / "none.toml")}),
    ])  # fmt: skip
    said = [run.stderr.strip() for run in runs]
    assert [run.rc for run in runs] == [2, 2]
    assert said[0] == f"framerelay: error: {bad}: models.v.input_w: Field required"
    assert said[1].endswith("none.toml: No such file or directory")
    assert all("\n" not in s and "Traceback" not in s for s in said)
