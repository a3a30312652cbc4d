"""A stream's own tracker time settings (issue 16): validated where they are given, sent in
the stream's OPEN, applied to its tracker on the worker.

* the ingest's ``StreamConfig`` and the orchestrator's ``StreamSpec`` take them with the
  tracker's own bounds; NaN, Infinity, out-of-range values and unknown names are refused
  with the field's name, never a traceback;
* a real worker (in this process, the real model) gets them in OPEN and its session's
  tracker runs with them; a tracker without time settings (``none``) is refused by the
  worker and the stream says why.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from deploy.ingest_link import definition_key, stream_config
from deploy.models import StreamSpec
from framerelay.results import ResultRecord
from framerelay.tracker_times import TrackerTimesConfig
from gpu_worker.server import Worker
from ingest.settings import StreamConfig
from tests.conftest import CLIP, TIMEOUT_FACTOR
from tests.support.waiting import wait_until_async
from tests.support.worker_harness import running_worker, streaming, token
from tracker.settings import HybridSettings as TrackerSettings

WAIT_S = 60 * TIMEOUT_FACTOR


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (float("nan"), "finite number"),
        (float("inf"), "finite number"),
        (1e9, "less than or equal to 3600"),
        (-1.0, "greater than or equal to 0"),
    ],
)
def test_bad_values_are_refused_naming_the_field(value: float, words: str) -> None:
    for model in (StreamConfig, StreamSpec):
        with pytest.raises(ValidationError) as info:
            model(id="cam", url="x.mp4", tracker_settings={"max_lost_s": value})
        said = str(info.value)
        assert "tracker_settings.max_lost_s" in said and words in said


def test_an_unknown_setting_name_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"tracker_settings\.max_lost"):
        StreamConfig(id="cam", url="x.mp4", tracker_settings={"max_lost": 2})


def test_the_api_bounds_are_the_trackers_own() -> None:
    for name, field in TrackerTimesConfig.model_fields.items():
        ours = {type(m).__name__: m for m in field.metadata}
        theirs = {type(m).__name__: m for m in TrackerSettings.model_fields[name].metadata}
        assert ours == theirs, name


def test_the_api_says_the_trackers_own_defaults() -> None:
    for name, field in TrackerTimesConfig.model_fields.items():
        default = TrackerSettings.model_fields[name].default
        assert f"(default {default:g}" in (field.description or ""), name


def test_the_orchestrator_passes_them_on_and_older_definitions_keep_their_digest() -> None:
    plain = StreamSpec(id="cam", url="x.mp4")
    own = StreamSpec(id="cam", url="x.mp4", tracker_settings={"max_gap_s": 20})
    assert "tracker_settings" not in stream_config(plain)
    assert stream_config(own)["tracker_settings"] == {"max_gap_s": 20.0}
    assert definition_key(plain) != definition_key(own)
    again = StreamConfig.model_validate(stream_config(own))  # what the ingest is sent
    assert again.tracker_settings == TrackerTimesConfig(max_gap_s=20)


def _tracker_settings(worker: Worker, stream_id: str) -> dict[str, Any] | None:
    for conn in worker.connections:
        session = conn.sessions.get(stream_id)
        if session is not None:
            settings = getattr(session.tracker, "settings", None)
            return settings.model_dump() if settings is not None else None
    return None


@pytest.mark.integration
async def test_a_streams_own_settings_reach_its_tracker_on_the_worker(secret: str) -> None:
    times = {"max_lost_s": 2.5, "max_gap_s": 4.0}
    config = StreamConfig(id="cam", url=str(CLIP), fps=5, realtime=True, loop=True,
                          tracker_settings=times)  # fmt: skip
    plain = StreamConfig(id="cam2", url=str(CLIP), fps=5, realtime=True, loop=True)
    records: list[ResultRecord] = []

    async with (
        running_worker(secret) as (worker, url),
        streaming(url, token(secret), records, config),
        streaming(url, token(secret), records, plain),
    ):
        await wait_until_async(
            lambda: {r.stream_id for r in records} == {"cam", "cam2"},
            WAIT_S,
            "results of both streams",
        )
        own, default = _tracker_settings(worker, "cam"), _tracker_settings(worker, "cam2")
    assert own is not None and default is not None
    assert (own["max_lost_s"], own["max_gap_s"]) == (2.5, 4.0)
    defaults = TrackerSettings().model_dump()
    assert (default["max_lost_s"], default["max_gap_s"]) == (
        defaults["max_lost_s"], defaults["max_gap_s"]
    )  # fmt: skip
    assert {k: v for k, v in own.items() if k not in times} == {
        k: v for k, v in default.items() if k not in times
    }


@pytest.mark.integration
async def test_a_tracker_without_time_settings_is_refused_and_the_stream_says_why(
    secret: str,
) -> None:
    config = StreamConfig(id="cam", url=str(CLIP), fps=5, realtime=True, loop=True,
                          tracker="none", tracker_settings={"max_lost_s": 2})  # fmt: skip

    async with (
        running_worker(secret) as (_, url),
        streaming(url, token(secret), [], config) as (_, stream),
    ):
        await wait_until_async(lambda: stream.last_error is not None, WAIT_S, "the stream's error")
        said = stream.last_error
    assert said == (
        "the worker refused the stream: bad_tracker: "
        "tracker 'none' has no time settings to set per stream"
    )
