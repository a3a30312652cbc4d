"""Settings helpers shared by the services.

Each service has one ``pydantic-settings`` model (env prefix ``FRAMERELAY_``,
``extra="forbid"``) built in ``main()``, never at import time. Secrets are
``SecretStr`` so they never print, and each secret setting ``X`` can instead
be read from the file named by ``X_FILE`` (:class:`ServiceSettings`).

Every number of every setting is finite: NaN and Infinity are refused at the
top level (``allow_inf_nan=False``) and, with the path to the value, in nested
models and lists too (stream definitions, tiers, results settings), so a time
setting can never be ``inf``. Redis URLs are checked at load with
:func:`redis_url_problem`, which never repeats a password.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from pydantic import AliasChoices, BaseModel, SecretStr, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from framerelay.data import DEFAULT_CLIP as DEFAULT_CLIP  # the defaults ship in the wheel
from framerelay.data import DEFAULT_MODEL as DEFAULT_MODEL
from framerelay.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLES = REPO_ROOT / "samples"  # a source checkout's samples (benches, tests)


MAX_SECRET_FILE_BYTES = 1 << 20
MAX_NESTING = 8
"""Nested settings deeper than this are not searched for non-finite numbers."""


def _is_secret(annotation: object) -> bool:
    return annotation is SecretStr or SecretStr in typing.get_args(annotation)


def _model_of(annotation: object) -> type[BaseModel] | None:
    models = _models_of(annotation)
    return models[0] if models else None


def _models_of(annotation: object) -> list[type[BaseModel]]:
    """The models an annotation may hold (``A | B``, ``Annotated[A | B, ...]``, ``A | None``)."""
    out: list[type[BaseModel]] = []
    todo = [annotation]
    while todo:
        arg = todo.pop(0)
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            out.append(arg)
        else:
            todo.extend(typing.get_args(arg))
    return out


def _env_names(prefix: str, name: str, field: FieldInfo) -> list[str]:
    names = [f"{prefix}{name}".upper()]
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        names += [c.upper() for c in alias.choices if isinstance(c, str) and c.isupper()]
    return names


def read_secret_file(label: str, path: str) -> str:
    """The contents of a secret file (trailing newline dropped); ConfigError if unreadable."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_SECRET_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{label}: cannot read {path!r} ({exc.strerror})") from None
    if len(data) > MAX_SECRET_FILE_BYTES:
        raise ConfigError(f"{label}: {path!r} is larger than {MAX_SECRET_FILE_BYTES} bytes")
    try:
        return data.decode().rstrip("\r\n")
    except UnicodeDecodeError:
        raise ConfigError(f"{label}: {path!r} is not UTF-8 text") from None


class SecretFilesSource(PydanticBaseSettingsSource):
    """Every secret setting ``X`` also reads ``X_FILE`` (Docker/Kubernetes secret files)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ does the work

    def __call__(self) -> dict[str, Any]:
        prefix = str(self.config.get("env_prefix", ""))
        delim = str(self.config.get("env_nested_delimiter") or "__")
        return _secret_files(self.settings_cls.model_fields, prefix, delim, depth=2)


def _secret_files(
    fields: dict[str, FieldInfo], prefix: str, delim: str, depth: int
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, field in fields.items():
        if _is_secret(field.annotation):
            for env in _env_names(prefix, name, field):
                path = os.environ.get(f"{env}_FILE")
                if path is None:
                    continue
                if env in os.environ:
                    raise ConfigError(f"set {env} or {env}_FILE, not both")
                out[name] = read_secret_file(f"{env}_FILE", path)
                break
            continue
        model = _model_of(field.annotation)
        if model is not None and depth > 1:
            inner = _secret_files(model.model_fields, f"{prefix}{name}{delim}", delim, depth - 1)
            if inner:
                out[name] = inner
    return out


def _secret_names(fields: dict[str, FieldInfo], prefix: str, delim: str, depth: int) -> set[str]:
    names: set[str] = set()
    for name, field in fields.items():
        if _is_secret(field.annotation):
            names.update(_env_names(prefix, name, field))
        elif (model := _model_of(field.annotation)) is not None and depth > 1:
            names |= _secret_names(model.model_fields, f"{prefix}{name}{delim}", delim, depth - 1)
    return names


class _EnvWithoutSecretFiles(EnvSettingsSource):
    """The env source, blind to the ``X_FILE`` variables :class:`SecretFilesSource` reads."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        env = super()._load_env_vars()
        prefix = str(self.config.get("env_prefix", ""))
        delim = str(self.config.get("env_nested_delimiter") or "__")
        files = {
            f"{n}_FILE".lower()
            for n in _secret_names(self.settings_cls.model_fields, prefix, delim, 2)
        }
        return {k: v for k, v in env.items() if k.lower() not in files}

    def prepare_field_value(
        self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool
    ) -> Any:
        try:
            return super().prepare_field_value(field_name, field, value, value_is_complex)
        except ValueError as exc:  # never quote the value: it may be a secret
            prefix = str(self.config.get("env_prefix", ""))
            env = _env_names(prefix, field_name, field)[-1]
            why = f" ({exc.msg}, line {exc.lineno} column {exc.colno})" if isinstance(
                exc, json.JSONDecodeError) else ""  # fmt: skip
            raise ConfigError(
                f"{env} is not valid JSON{why}; lists and objects are given as JSON, e.g. "
                f"{env}='[...]' or '{{...}}'"
            ) from None


def non_finite(value: object, path: str = "", depth: int = MAX_NESTING) -> str | None:
    """The dotted path of the first NaN/Infinity in ``value`` (models, dicts, lists), else None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path or "value"
    if depth <= 0 or isinstance(value, str | bytes | SecretStr):
        return None
    items: list[tuple[str, object]]
    if isinstance(value, BaseModel):
        items = [(name, getattr(value, name, None)) for name in type(value).model_fields]
    elif isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list | tuple | set | frozenset):
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        return None
    for key, item in items:
        found = non_finite(item, f"{path}.{key}" if path else key, depth - 1)
        if found is not None:
            return found
    return None


REDIS_URL_FORM = "redis://[user:password@]host[:port][/db], rediss://... or unix:///path"


def redis_url_problem(url: str) -> str | None:
    """Why redis-py cannot use ``url`` (never quoting its password), or None when it can."""
    from redis.asyncio.connection import parse_url

    try:
        parse_url(url)
    except ValueError as exc:
        reason = str(exc)
        try:
            secret = urlsplit(url).password
        except ValueError:
            secret = None
        if secret:
            reason = reason.replace(secret, "***")
        return f"not a usable Redis URL ({reason[:200]}); expected {REDIS_URL_FORM}"
    return None


def redis_url_has_password(url: str) -> bool:
    """Whether ``url`` carries a password (``redis://user:pw@...`` or ``redis://:pw@...``)."""
    try:
        return bool(urlsplit(url).password)
    except ValueError:
        return "@" in url  # unparsable: assume the worst, never echo it


def _nested_models(annotation: object) -> list[type[BaseModel]]:
    """Models whose fields the env may set one by one (``A__B``); not those in lists."""
    if typing.get_origin(annotation) in (list, tuple, set, frozenset):
        return []
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _nested_models(arg)]


def _is_mapping(annotation: object) -> bool:
    if typing.get_origin(annotation) is dict:
        return True
    return any(_is_mapping(arg) for arg in typing.get_args(annotation))


def _known_env(
    fields: dict[str, FieldInfo], prefix: str, delim: str, depth: int
) -> tuple[set[str], set[str]]:
    """(every env name of these settings, prefixes under which any name is a dict key)."""
    exact: set[str] = set()
    open_prefixes: set[str] = set()
    for name, field in fields.items():
        names = _env_names(prefix, name, field)
        exact.update(names)
        if _is_secret(field.annotation):
            exact.update(f"{n}_FILE" for n in names)
        inner = f"{prefix}{name}{delim}".upper()
        if _is_mapping(field.annotation):
            open_prefixes.add(inner)
        for model in _nested_models(field.annotation) if depth > 1 else []:
            more, more_open = _known_env(model.model_fields, inner, delim, depth - 1)
            exact |= more
            open_prefixes |= more_open
    return exact, open_prefixes


def unknown_env_problem(
    prefix: str, known: set[str], open_prefixes: set[str], environ: Mapping[str, str]
) -> str | None:
    """One line naming each ``prefix*`` variable that is no setting, with the nearest
    valid name (names only, never values), or None when there is none."""
    said = []
    for var in sorted(environ):
        name = var.upper()
        if not name.startswith(prefix) or name in known or name.startswith(tuple(open_prefixes)):
            continue
        said.append(f"{var} ({_nearest(prefix, name, known)})")
    if not said:
        return None
    return f"unknown setting{'s' if len(said) > 1 else ''}: " + "; ".join(said)


def _nearest(prefix: str, name: str, known: set[str]) -> str:
    """``did you mean X?`` by the part after the prefix (the prefix itself matches all)."""
    tails = {k.removeprefix(prefix): k for k in known if k.startswith(prefix)}
    near = difflib.get_close_matches(name.removeprefix(prefix), sorted(tails), n=1, cutoff=0.6)
    if near:
        return f"did you mean {tails[near[0]]}?"
    return f"no {prefix}* setting is near it; unset it"


class ServiceSettings(BaseSettings):
    """Base of every service's settings: env, then ``*_FILE`` for secret settings; every
    number finite (subclasses' ``model_config`` is merged with this one).

    A variable under the service's own prefix that names no setting is an error
    naming the nearest valid one (a typo in a TLS setting must not leave a
    tunnel in plaintext); other services' prefixes and shared names are not
    this service's business.
    """

    model_config = SettingsConfigDict(allow_inf_nan=False)
    env_also: ClassVar[frozenset[str]] = frozenset()
    """Names under this prefix that are no setting but are read elsewhere (by the CLI)."""
    env_retired: ClassVar[frozenset[str]] = frozenset()
    """Names under this prefix that are gone: the service warns about them, never refuses."""

    @classmethod
    def env_problem(cls, environ: Mapping[str, str]) -> str | None:
        """The unknown variables under this service's prefix (see :func:`unknown_env_problem`)."""
        prefix = str(cls.model_config.get("env_prefix", "")).upper()
        if not prefix:
            return None
        delim = str(cls.model_config.get("env_nested_delimiter") or "__")
        known, open_prefixes = _known_env(cls.model_fields, prefix, delim, depth=3)
        known |= cls.env_also | cls.env_retired
        return unknown_env_problem(prefix, known, open_prefixes, environ)

    @classmethod
    def env_name(cls, field: str) -> str | None:
        """The environment variable of the top-level setting ``field`` (None: no such one)."""
        info = cls.model_fields.get(field)
        if info is None:
            return None
        return _env_names(str(cls.model_config.get("env_prefix", "")), field, info)[-1]

    @model_validator(mode="after")
    def _finite_everywhere(self) -> ServiceSettings:
        where = non_finite(self)
        if where is not None:
            raise ValueError(f"{where} must be a finite number (not NaN or Infinity)")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        if issubclass(settings_cls, ServiceSettings):
            problem = settings_cls.env_problem(os.environ)
            if problem is not None:
                raise ConfigError(problem)
        env = _EnvWithoutSecretFiles(settings_cls)
        return (init_settings, env, SecretFilesSource(settings_cls), dotenv_settings)


def settings_class(title: str) -> type[ServiceSettings] | None:
    """The service settings model called ``title`` (a ValidationError's title)."""
    todo: list[type[ServiceSettings]] = [ServiceSettings]
    while todo:
        cls = todo.pop()
        if cls.__name__ == title:
            return cls
        todo.extend(cls.__subclasses__())
    return None


def settings_error(exc: BaseException) -> str | None:
    """One line for pydantic-settings' own errors (a value it could not read), else None."""
    from pydantic_settings import SettingsError

    if not isinstance(exc, SettingsError):
        return None
    return f"{exc}; check the environment variables of that setting"


def describe_invalid(exc: ValidationError) -> str:
    """One line: each bad setting (and its environment variable) and why; no values."""
    model = settings_class(exc.title)
    problems = []
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        msg = str(err["msg"]).removeprefix("Value error, ")
        env = model.env_name(loc[0]) if model is not None and loc else None
        where = ".".join(loc) + (f" ({env})" if env and len(loc) == 1 else "")
        where += f" (in {env})" if env and len(loc) > 1 else ""
        problems.append(f"{where}: {msg}" if where else msg)
    return f"invalid {exc.title}: " + "; ".join(problems).replace("\n", " ")
