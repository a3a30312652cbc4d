"""Issue 11: every number of every service's settings is finite (framerelay.settings).

The base :class:`ServiceSettings` refuses NaN/Infinity at the top level
(``allow_inf_nan=False``, merged into every service's config) and, with the
path to the value, anywhere below (nested models, lists, dicts) even where a
nested model does not refuse them itself. Bad settings read as one line that
names the variable; a Redis URL redis-py cannot use is refused at load, without
its password.
"""

from __future__ import annotations

import typing

import pytest
from pydantic import BaseModel, Field, SecretStr, ValidationError
from pydantic_settings import SettingsConfigDict

from deploy.settings import OrchestratorSettings
from framerelay.settings import (
    ServiceSettings,
    describe_invalid,
    non_finite,
    redis_url_problem,
    settings_class,
)
from gpu_worker.settings import WorkerSettings
from ingest.settings import IngestSettings

SECRET = "s" * 40
SERVICES: list[tuple[type[ServiceSettings], str]] = [
    (WorkerSettings, "FRAMERELAY_WORKER_"),
    (IngestSettings, "FRAMERELAY_INGEST_"),
    (OrchestratorSettings, "FRAMERELAY_ORCH_"),
]


def _floats(model: type[BaseModel]) -> list[str]:
    return [
        n
        for n, f in model.model_fields.items()
        if float in {f.annotation, *typing.get_args(f.annotation)}
    ]


CASES = [
    pytest.param(cls, f"{prefix}{name.upper()}", value, id=f"{prefix}{name.upper()}={value}")
    for cls, prefix in SERVICES
    for name in _floats(cls)
    for value in ("inf", "-inf", "nan")
]


def test_every_service_inherits_the_rule() -> None:
    for cls, _ in SERVICES:
        assert issubclass(cls, ServiceSettings)
        assert cls.model_config.get("allow_inf_nan") is False, cls
        assert settings_class(cls.__name__) is cls


@pytest.mark.parametrize(("cls", "env", "value"), CASES)
def test_no_float_setting_takes_nan_or_infinity(
    cls: type[ServiceSettings], env: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ValidationError) as info:
        cls(token_secrets=SECRET)  # type: ignore[call-arg]
    line = describe_invalid(info.value)
    assert env in line and "finite number" in line and "\n" not in line, line


class _Loose(BaseModel):  # a nested model that does not refuse NaN itself
    t: float = 1.0
    more: list[float] = Field(default_factory=list)


class _Demo(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FRAMERELAY_DEMO_", env_nested_delimiter="__")

    loose: _Loose = Field(default_factory=_Loose)
    table: dict[str, _Loose] = Field(default_factory=dict)


@pytest.mark.parametrize(
    ("env", "value", "path"),
    [
        ("FRAMERELAY_DEMO_LOOSE__T", "inf", "loose.t"),
        ("FRAMERELAY_DEMO_LOOSE", '{"more": [1, NaN]}', "loose.more.1"),
        ("FRAMERELAY_DEMO_TABLE", '{"a": {"t": -Infinity}}', "table.a.t"),
    ],
)
def test_nested_numbers_are_checked_with_their_path(
    env: str, value: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ValidationError) as info:
        _Demo()
    assert describe_invalid(info.value) == (
        f"invalid _Demo: {path} must be a finite number (not NaN or Infinity)"
    )


def test_non_finite_walks_models_lists_and_dicts() -> None:
    assert non_finite(_Loose()) is None
    assert non_finite({"a": [1.0, (2.0, float("nan"))]}) == "a.1.1"
    assert non_finite(float("inf")) == "value"
    assert non_finite(SecretStr("inf")) is None and non_finite("nan") is None


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("redis://127.0.0.1:6379/0", True),
        ("rediss://user:pw@host/1", True),
        ("unix:///run/redis.sock", True),
        ("redis://user:Pa55word@127.0.0.1:notaport/0", False),
        ("redis://user:Pa55word@[::1/0", False),
        ("redis://user:Pa55word@127.0.0.1:99999/0", False),
        ("http://user:Pa55word@127.0.0.1:6379", False),
    ],
)
def test_redis_urls_are_checked_without_their_password(url: str, ok: bool) -> None:
    problem = redis_url_problem(url)
    assert (problem is None) is ok, problem
    if problem is not None:
        assert "Pa55word" not in problem and "not a usable Redis URL" in problem
