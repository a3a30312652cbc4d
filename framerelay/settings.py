"""Settings helpers shared by the services.

Each service has one ``pydantic-settings`` model (env prefix ``FRAMERELAY_``,
``extra="forbid"``) built in ``main()``, never at import time. Secrets are
``SecretStr`` so they never print, and each secret setting ``X`` can instead
be read from the file named by ``X_FILE`` (:class:`ServiceSettings`).
"""

from __future__ import annotations

import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource

from framerelay.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLES = REPO_ROOT / "samples"
DEFAULT_MODEL = SAMPLES / "models" / "yolox_nano_416.onnx"
DEFAULT_CLIP = SAMPLES / "mot15" / "TUD-Stadtmitte" / "TUD-Stadtmitte.mp4"


MAX_SECRET_FILE_BYTES = 1 << 20


def _is_secret(annotation: object) -> bool:
    return annotation is SecretStr or SecretStr in typing.get_args(annotation)


def _model_of(annotation: object) -> type[BaseModel] | None:
    for arg in (annotation, *typing.get_args(annotation)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


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


class ServiceSettings(BaseSettings):
    """Base of every service's settings: env, then ``*_FILE`` for secret settings."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        env = _EnvWithoutSecretFiles(settings_cls)
        return (init_settings, env, SecretFilesSource(settings_cls), dotenv_settings)
