"""Issue 11: NaN, Infinity and out-of-range numbers never reach the orchestrator.

The API parses JSON with Python's ``json`` module, which takes the literals
``NaN``, ``Infinity`` and ``-Infinity`` (and turns ``1e400`` into infinity), so
they do reach the request models: every numeric field of every request model
refuses them with a 422 that says which field and why, and nothing is stored.
Settings: ``inf``/``nan`` anywhere (top level, tiers, nested) and a malformed
Redis URL are a one-line error and exit 2 from the real CLI, never a traceback,
never the URL's password.
"""

from __future__ import annotations

import logging
import typing
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ValidationError

from deploy.api import Move, NewPod, create_app
from deploy.health import StatusProber
from deploy.ingest_link import NullIngestLink
from deploy.models import StreamSpec
from deploy.service import Orchestrator
from deploy.settings import OrchestratorSettings
from framerelay.settings import describe_invalid
from tests.support.auth import ed_keys, mint
from tests.support.bad_numbers import BAD_NUMBERS, CLEAR
from tests.support.cli_runs import clean_env, run_all
from tests.support.orchestrator import orch_settings, serving, serving_here

# (model, a valid body, the route) for each request model of the API with a number in it
ROUTES: list[tuple[type[BaseModel], dict[str, Any], str]] = [
    (StreamSpec, {"id": "cam-1", "url": "rtsp://cam/1"}, "/v1/streams"),
    (NewPod, {"tier": "ondemand"}, "/v1/pods"),
    (Move, {"worker": "fr-ondemand-0-g0"}, "/v1/streams/cam-1/move"),
]


def numeric_fields(model: type[BaseModel]) -> list[str]:
    """Fields of ``model`` that take a number (int or float, optional or not; not bool)."""
    out = []
    for name, field in model.model_fields.items():
        kinds = {field.annotation, *typing.get_args(field.annotation)}
        if kinds & {int, float}:
            out.append(name)
    return out


CASES = [
    pytest.param(route, {**body}, name, raw, id=f"{model.__name__}.{name}={label}")
    for model, body, route in ROUTES
    for name in numeric_fields(model)
    for label, raw in BAD_NUMBERS
]


def test_every_request_model_with_numbers_is_in_the_table() -> None:
    assert numeric_fields(StreamSpec) == ["fps", "latency_slo_ms"]
    assert numeric_fields(NewPod) == numeric_fields(Move) == []
    assert len(CASES) == 2 * len(BAD_NUMBERS)


def _body(valid: dict[str, Any], field: str, raw: str) -> bytes:
    """``valid`` as JSON with ``field`` set to the literal ``raw`` (json.dumps cannot)."""
    import json

    text = json.dumps({**valid, field: "@@"})
    return text.replace('"@@"', raw).encode()


@pytest.fixture(scope="module")
async def orch_api(
    tmp_path_factory: pytest.TempPathFactory, anyio_backend: str
) -> AsyncIterator[httpx.Client]:
    """An orchestrator API in a thread (requests refused at validation never touch Redis)
    and a client with a token for it."""
    keys = ed_keys()
    settings = orch_settings(tmp_path_factory.mktemp("orch"), keys)
    orch = Orchestrator(settings, prober=StatusProber(20), ingest=NullIngestLink())
    token = mint(keys, ["fleet:read", "fleet:write"], "orchestrator", ttl=600)
    with serving(create_app(orch)) as url:
        auth = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, headers=auth, timeout=10) as http:
            yield http
    await orch.aclose()


@pytest.mark.parametrize(("route", "valid", "field", "raw"), CASES)
def test_bad_numbers_are_a_clear_422(
    orch_api: httpx.Client, route: str, valid: dict[str, Any], field: str, raw: str,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.ERROR)
    r = orch_api.post(route, content=_body(valid, field, raw),
                      headers={"Content-Type": "application/json"})  # fmt: skip
    assert r.status_code == 422, r.text
    assert "Traceback" not in r.text and raw not in r.text
    errors = r.json()["detail"]
    assert [e["loc"] for e in errors] == [["body", field]], errors
    assert all(any(c in e["msg"] for c in CLEAR) for e in errors), errors
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


@pytest.mark.integration
async def test_bounds_still_let_valid_numbers_through(tmp_path: Path) -> None:
    keys = ed_keys()
    orch = Orchestrator(
        orch_settings(tmp_path, keys), prober=StatusProber(20), ingest=NullIngestLink()
    )
    token = {
        "Authorization": f"Bearer {mint(keys, ['fleet:write'], 'orchestrator')}",
        "Content-Type": "application/json",
    }
    try:
        async with serving_here(create_app(orch)) as url, httpx.AsyncClient() as http:
            out = []
            for i, fps in enumerate(("240", "0.5", "1e-3", "7")):
                body = _body({"id": f"cam-{i}", "url": "rtsp://cam"}, "fps", fps)
                r = await http.post(url + "/v1/streams", content=body, headers=token)
                out.append(r.status_code)
    finally:
        await orch.store.clear()
        await orch.aclose()

    assert out == [201, 201, 201, 201]


# -- settings, through the real CLI ---------------------------------------------------

PASSWORD = "Hunter2RedisPassw0rd"
SETTINGS_CASES: list[tuple[dict[str, str], str]] = [
    ({"FRAMERELAY_ORCH_TICK_S": "inf"}, "FRAMERELAY_ORCH_TICK_S"),
    ({"FRAMERELAY_ORCH_CANARY_TIMEOUT_S": "nan"}, "FRAMERELAY_ORCH_CANARY_TIMEOUT_S"),
    ({"FRAMERELAY_ORCH_HEARTBEAT_TIMEOUT_S": "-inf"}, "FRAMERELAY_ORCH_HEARTBEAT_TIMEOUT_S"),
    ({"FRAMERELAY_ORCH_STARTUP_GRACE_S": "1e308"}, "FRAMERELAY_ORCH_STARTUP_GRACE_S"),
    ({"FRAMERELAY_ORCH_TIERS": '[{"name": "a", "lead_s": NaN}]'}, "FRAMERELAY_ORCH_TIERS"),
    ({"FRAMERELAY_ORCH_RUNPOD__TIMEOUT_S": "Infinity"}, "FRAMERELAY_ORCH_RUNPOD"),
    ({"FRAMERELAY_ORCH_MODEL_COSTS": '{"yolox_nano": Infinity}'}, "FRAMERELAY_ORCH_MODEL_COSTS"),
    ({"FRAMERELAY_ORCH_REDIS_URL": f"redis://app:{PASSWORD}@127.0.0.1:notaport/0"},
     "FRAMERELAY_ORCH_REDIS_URL"),
    ({"FRAMERELAY_ORCH_REDIS_URL": f"http://app:{PASSWORD}@127.0.0.1:6379/0"},
     "FRAMERELAY_ORCH_REDIS_URL"),
]  # fmt: skip


@pytest.mark.parametrize(("env", "name"), SETTINGS_CASES, ids=[n for _, n in SETTINGS_CASES])
def test_bad_settings_are_refused_with_their_name(
    env: dict[str, str], name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValidationError) as info:
        OrchestratorSettings(token_secrets="s" * 40, ca_dir=tmp_path)
    line = describe_invalid(info.value)
    assert name in line and "\n" not in line and PASSWORD not in line, line


def test_bad_settings_are_one_line_and_exit_2_from_the_cli(tmp_path: Path) -> None:
    secret = "s" * 40
    base = clean_env(FRAMERELAY_TOKEN_SECRETS=secret, FRAMERELAY_ORCH_CA_DIR=str(tmp_path))
    cases = [SETTINGS_CASES[i] for i in (0, 4, 7)]  # top level, nested JSON, Redis URL
    runs = run_all([(["orchestrator", "--port", "0"], base | env) for env, _ in cases])
    for (env, name), run in zip(cases, runs, strict=True):
        lines = run.stderr.strip().splitlines()
        print(f"\n{env} -> rc {run.rc}: {run.stderr.strip()}")
        assert run.rc == 2, (env, run.stderr[-2000:])
        assert len(lines) == 1 and lines[0].startswith("framerelay: error: "), run.stderr
        assert name in lines[0] and "Traceback" not in run.stderr
        assert PASSWORD not in run.stderr + run.stdout and secret not in run.stderr
