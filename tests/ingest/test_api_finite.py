"""Issue 11: NaN, Infinity and out-of-range numbers never reach an ingest stream.

The API parses JSON with Python's ``json`` module, which takes ``NaN``,
``Infinity`` and ``-Infinity`` (and reads ``1e400`` as infinity), so they do
reach the models. Every numeric field of a stream definition, on every route
that takes one (add, replace, and the orchestrator's assignment with a
definition), refuses them with a 422 that names the field and says why, with
no traceback, no echo, and nothing created. Settings with ``inf``/``nan``
(top level, results, stream definitions in the environment) are a one-line
error, exit 2, from the real CLI.
"""

from __future__ import annotations

import json
import logging
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ValidationError

from framerelay.settings import describe_invalid
from ingest.app import create_app
from ingest.service import IngestService
from ingest.settings import IngestSettings, ResultsSettings, StreamConfig
from ingest.store import FileStore
from tests.conftest import CLIP
from tests.support.auth import mint
from tests.support.bad_numbers import BAD_NUMBERS, CLEAR
from tests.support.cli_runs import clean_env, run_all
from tests.support.ingest_api import settings_for
from tests.support.orchestrator import serving

SECRET = "s" * 40
VALID = {"id": "cam-1", "url": str(CLIP)}


def numeric_fields(model: type[BaseModel]) -> list[str]:
    """Fields of ``model`` that take a number (int or float, optional or not; not bool)."""
    out = []
    for name, field in model.model_fields.items():
        kinds = {field.annotation, *typing.get_args(field.annotation)}
        if kinds & {int, float}:
            out.append(name)
    return out


def _literal(doc: Any, raw: str) -> bytes:
    """``doc`` as JSON with the value ``"@@"`` replaced by the literal ``raw``."""
    return json.dumps(doc).replace('"@@"', raw).encode()


def _request(route: str, field: str, raw: str) -> tuple[str, str, bytes, list[str]]:
    """(method, path, body, loc of the bad field) for one route taking a definition."""
    definition = {**VALID, field: "@@"}
    if route == "add":
        return "POST", "/v1/streams", _literal(definition, raw), ["body", field]
    if route == "replace":
        return "PUT", "/v1/streams/cam-1", _literal(definition, raw), ["body", field]
    assign = {"worker_id": "w", "url": "ws://127.0.0.1:9/v1/tunnel", "stream": definition}
    return "PUT", "/v1/streams/cam-1/worker", _literal(assign, raw), ["body", "stream", field]


CASES = [
    pytest.param(route, name, raw, id=f"{route}.{name}={label}")
    for route in ("add", "replace", "assign")
    for name in numeric_fields(StreamConfig)
    for label, raw in BAD_NUMBERS
]


@pytest.fixture(scope="module")
def ingest_api(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[httpx.Client, IngestService]]:
    """The ingest API in a thread (its service not running: bad bodies never reach it) and
    a client with a token for it."""
    settings = settings_for(SECRET, tmp_path_factory.mktemp("ingest"))
    service = IngestService(settings, store=FileStore(settings.store_path))
    token = mint(SECRET, ["streams:write", "routing:write"], "ingest", ttl=600)
    with serving(create_app(service, registry=CollectorRegistry())) as url:
        auth = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, headers=auth, timeout=10) as http:
            yield http, service


def test_the_table_covers_the_definitions_numbers() -> None:
    fields = numeric_fields(StreamConfig)
    assert {"fps", "max_frames", "open_timeout_s", "healthy_after_s", "max_retries"} <= set(fields)
    assert len(CASES) == 3 * len(fields) * len(BAD_NUMBERS)


@pytest.mark.parametrize(("route", "field", "raw"), CASES)
def test_bad_numbers_are_a_clear_422(
    ingest_api: tuple[httpx.Client, IngestService], route: str, field: str, raw: str,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    http, service = ingest_api
    method, path, body, loc = _request(route, field, raw)
    caplog.set_level(logging.ERROR)
    r = http.request(method, path, content=body, headers={"Content-Type": "application/json"})
    if r.status_code < 300:  # accepted: remove it again, so that one failure stays one
        for gone in ("/v1/streams/cam-1/worker", "/v1/streams/cam-1"):
            http.delete(gone)
    assert r.status_code == 422, r.text[:300]
    assert "Traceback" not in r.text and raw not in r.text
    errors = r.json()["detail"]
    assert [e["loc"] for e in errors] == [loc], errors
    assert all(any(c in e["msg"] for c in CLEAR) for e in errors), errors
    assert not service.streams and not service.registry.where
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


# -- settings -------------------------------------------------------------------------


def _float_fields(model: type[BaseModel]) -> list[str]:
    return [
        n
        for n, f in model.model_fields.items()
        if float in {f.annotation, *typing.get_args(f.annotation)}
    ]


SETTINGS_ENV = (
    [(f"FRAMERELAY_INGEST_{n.upper()}", "inf") for n in _float_fields(IngestSettings)]
    + [(f"FRAMERELAY_INGEST_RESULTS__{n.upper()}", "nan") for n in _float_fields(ResultsSettings)]
    + [
        ("FRAMERELAY_INGEST_STREAMS", _literal([{**VALID, n: "@@"}], "Infinity").decode())
        for n in _float_fields(StreamConfig)
    ]
)


@pytest.mark.parametrize(("name", "value"), SETTINGS_ENV)
def test_every_float_setting_is_finite(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as info:
        IngestSettings(token_secrets=SECRET)
    line = describe_invalid(info.value)
    assert "\n" not in line and any(c in line for c in CLEAR), line


def test_bad_settings_are_one_line_and_exit_2_from_the_cli(tmp_path: Path) -> None:
    base = clean_env(FRAMERELAY_TOKEN_SECRETS=SECRET,
                     FRAMERELAY_INGEST_STORE_PATH=str(tmp_path / "streams.json"))  # fmt: skip
    cases = [
        {"FRAMERELAY_INGEST_FRAME_TIMEOUT_S": "inf"},
        {"FRAMERELAY_INGEST_RESULTS__PING_TIMEOUT_S": "nan"},
        {"FRAMERELAY_INGEST_STREAMS": _literal([{**VALID, "healthy_after_s": "@@"}], "Infinity")
         .decode()},
    ]  # fmt: skip
    runs = run_all([(["ingest"], base | env) for env in cases])
    for env, run in zip(cases, runs, strict=True):
        lines = run.stderr.strip().splitlines()
        print(f"\n{env} -> rc {run.rc}: {run.stderr.strip()}")
        assert run.rc == 2, (env, run.stderr[-2000:])
        assert len(lines) == 1 and lines[0].startswith("framerelay: error: "), run.stderr
        assert "Traceback" not in run.stderr and SECRET not in run.stderr
