"""The serverless handler with the real ONNX model on CPU: frames of the sample clip in,
detections per frame out, in batches of the worker's size; bad input gets one line in
``error`` (RunPod fails the job with it), never an exception or a traceback."""

from __future__ import annotations

import base64
import importlib.util
import logging
import subprocess
import sys
import types
from collections.abc import Sequence
from typing import Any

import av
import pytest

from gpu_worker.detectors import Detector, ModelInput, OnnxDetectorSettings, load_detector
from gpu_worker.serverless import (
    MAX_FRAMES,
    ServerlessHandler,
    build_handler,
    main,
    serve_runpod,
)
from gpu_worker.settings import WorkerSettings
from ingest.prepare import Preparer
from tests.conftest import CLIP, MODEL


class Counting:
    """The real detector, recording each batch's size."""

    def __init__(self, inner: Detector) -> None:
        self.inner = inner
        self.input_size = inner.input_size
        self.class_names = inner.class_names
        self.providers = inner.providers
        self.batches: list[int] = []

    def infer(self, batch: Sequence[ModelInput]) -> list[Any]:
        self.batches.append(len(batch))
        return self.inner.infer(batch)


@pytest.fixture(scope="module")
def detector() -> Counting:
    return Counting(load_detector(OnnxDetectorSettings(model=MODEL, threads=1)))


@pytest.fixture(scope="module")
def frames() -> list[dict[str, Any]]:
    """The clip's first 10 frames as a job's frames (prepared as the ingest does)."""
    preparer, out = Preparer(416, 416), []
    with av.open(str(CLIP)) as container:
        for frame in container.decode(video=0):
            p = preparer.prepare(frame)
            lb = p.letterbox
            data = base64.b64encode(p.data).decode()
            out.append({"pts": frame.pts, "src_w": lb.src_w, "src_h": lb.src_h,
                        "scale": lb.scale, "jpeg_b64": data})  # fmt: skip
            if len(out) == 10:
                break
    return out


@pytest.fixture
def handler(detector: Counting) -> ServerlessHandler:
    detector.batches.clear()
    settings = WorkerSettings(worker_id="sl-1", max_batch=4)
    return build_handler(settings, detector)


def test_detections_per_frame_in_batches(
    handler: ServerlessHandler, detector: Counting, frames: list[dict[str, Any]]
) -> None:
    out = handler({"id": "job-1", "input": {"frames": frames}})
    assert "error" not in out
    assert out["model"] == "yolox_nano" and out["worker_id"] == "sl-1"
    assert [r["pts"] for r in out["results"]] == [f["pts"] for f in frames]
    assert detector.batches == [4, 4, 2]
    person = out["class_names"].index("person")
    first = out["results"][0]
    assert sum(c == person for c in first["class_id"]) >= 3  # the canary's expectation
    for r in out["results"]:
        assert len(r["xyxy"]) == len(r["confidence"]) == len(r["class_id"])
        assert all(0 <= x <= 640 and 0 <= y <= 480 for x1, y1, x2, y2 in r["xyxy"]
                   for x, y in ((x1, y1), (x2, y2)))  # fmt: skip
        assert all(c >= 0.25 for c in r["confidence"])  # the worker's result_min_confidence
    assert set(out["timings"]) == {"decode_ms", "infer_ms"}


def test_min_confidence_of_the_job(
    handler: ServerlessHandler, frames: list[dict[str, Any]]
) -> None:
    low = handler({"id": "j", "input": {"frames": frames[:1], "min_confidence": 0.1}})
    high = handler({"id": "j", "input": {"frames": frames[:1], "min_confidence": 0.9}})
    assert len(low["results"][0]["xyxy"]) > len(high["results"][0]["xyxy"])


def test_an_unreadable_frame_fails_alone(
    handler: ServerlessHandler, frames: list[dict[str, Any]]
) -> None:
    small = Preparer(320, 320)
    with av.open(str(CLIP)) as container:
        other = small.prepare(next(container.decode(video=0))).data
    bad = [{**frames[0], "jpeg_b64": base64.b64encode(b"\xff\xd8 not a jpeg").decode()},
           {**frames[1], "jpeg_b64": base64.b64encode(other).decode()},
           {**frames[2], "jpeg_b64": "!!!!"}, frames[3]]  # fmt: skip
    out = handler({"id": "j", "input": {"frames": bad}})
    errors = [r.get("error") for r in out["results"]]
    assert "undecodable JPEG" in errors[0]
    assert "320x320, the model input is 416x416" in errors[1]
    assert "not base64" in errors[2]
    assert errors[3] is None and out["results"][3]["xyxy"]


def _frame(**over: Any) -> dict[str, Any]:
    return {"pts": 1, "src_w": 640, "src_h": 480, "scale": 0.65, "jpeg_b64": "AAAA", **over}


@pytest.mark.parametrize(
    ("job", "problem"),
    [
        (None, "bad job"),
        ({"id": "j"}, "bad job"),
        ({"id": "j", "input": []}, "bad job"),
        ({"id": "j", "input": {}}, "frames: Field required"),
        ({"id": "j", "input": {"frames": []}}, "frames: List should have at least 1 item"),
        ({"id": "j", "input": {"frames": [_frame()] * (MAX_FRAMES + 1)}}, "at most 512"),
        ({"id": "j", "input": {"frames": [_frame()], "extra": 1}}, "extra: Extra inputs"),
        ({"id": "j", "input": {"frames": [_frame(scale=float("nan"))]}}, "finite number"),
        ({"id": "j", "input": {"frames": [_frame(scale=0)]}}, "greater than 0"),
        ({"id": "j", "input": {"frames": [_frame(scale=1e300)]}}, "less than or equal to 64"),
        ({"id": "j", "input": {"frames": [_frame(pts=2**70)]}}, "frames.0.pts"),
        ({"id": "j", "input": {"frames": [_frame(pts=True)]}}, "frames.0.pts"),
        ({"id": "j", "input": {"frames": [_frame(pts="7")]}}, "frames.0.pts"),
        ({"id": "j", "input": {"frames": [_frame(src_w=0)]}}, "frames.0.src_w"),
        ({"id": "j", "input": {"frames": [_frame(src_h=10**9)]}}, "frames.0.src_h"),
        ({"id": "j", "input": {"frames": [_frame(jpeg_b64="A" * 3_000_000)]}}, "jpeg_b64"),
        ({"id": "j", "input": {"frames": [_frame()], "model": "../etc"}}, "model: String"),
        ({"id": "j", "input": {"frames": [_frame()], "model": "nope"}}, "unknown model 'nope'"),
        ({"id": "j", "input": {"frames": [_frame()], "min_confidence": 2}}, "min_confidence"),
    ],
)
def test_bad_input_is_one_line_of_error(
    handler: ServerlessHandler, job: Any, problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    out = handler(job)
    assert set(out) == {"error"}
    assert problem in out["error"] and "\n" not in out["error"] and len(out["error"]) <= 300
    assert "Traceback" not in out["error"] and not caplog.records


def test_start_without_the_runpod_sdk_says_so(caplog: pytest.LogCaptureFixture) -> None:
    if importlib.util.find_spec("runpod") is not None:
        pytest.skip("the RunPod SDK is installed here")
    assert main([]) == 2
    assert "pip install runpod" in caplog.text
    run = subprocess.run(
        [sys.executable, "-m", "framerelay", "worker", "--serverless", "--model", str(MODEL)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 2 and "pip install runpod" in run.stderr
    assert "Traceback" not in run.stderr


def test_the_sdk_gets_the_handler(
    detector: Counting, frames: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve_runpod`` hands RunPod's SDK the handler (``runpod.serverless.start``); the
    SDK is replaced by a recorder, as it is not installed here."""
    started: list[dict[str, Any]] = []
    sdk = types.SimpleNamespace(serverless=types.SimpleNamespace(start=started.append))
    monkeypatch.setitem(sys.modules, "runpod", sdk)
    monkeypatch.setattr("gpu_worker.serverless.load_detector", lambda settings: detector)
    assert serve_runpod(WorkerSettings(worker_id="sl-2")) == 0
    (config,) = started
    out = config["handler"]({"id": "j", "input": {"frames": frames[:2]}})
    assert out["worker_id"] == "sl-2" and len(out["results"]) == 2
