"""Every secret setting ``X`` also reads ``X_FILE`` (Docker/Kubernetes secret files)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import SettingsConfigDict

from framerelay.errors import ConfigError
from framerelay.settings import ServiceSettings


class Nested(BaseModel):
    model_config = ConfigDict(extra="forbid")
    api_key: SecretStr | None = None


class Demo(ServiceSettings):
    model_config = SettingsConfigDict(
        env_prefix="FRDEMO_", env_nested_delimiter="__", extra="forbid"
    )
    password: SecretStr | None = None
    keys: SecretStr | None = Field(
        None, validation_alias=AliasChoices("keys", "FRAMERELAY_DEMO_KEYS")
    )
    plain: str = "x"
    provider: Nested = Field(default_factory=Nested)


def _secret(tmp_path: Path, text: str) -> str:
    path = tmp_path / f"secret-{len(list(tmp_path.iterdir()))}"
    path.write_text(text)
    return str(path)


def test_file_variants(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRDEMO_PASSWORD_FILE", _secret(tmp_path, "hunter2\n"))
    monkeypatch.setenv("FRAMERELAY_DEMO_KEYS_FILE", _secret(tmp_path, '{"keys": []}'))
    monkeypatch.setenv("FRDEMO_PROVIDER__API_KEY_FILE", _secret(tmp_path, "rp-key"))
    s = Demo()
    assert s.password is not None and s.password.get_secret_value() == "hunter2"
    assert s.keys is not None and s.keys.get_secret_value() == '{"keys": []}'
    assert s.provider.api_key is not None and s.provider.api_key.get_secret_value() == "rp-key"
    assert "hunter2" not in repr(s)


def test_env_wins_nothing_both_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRDEMO_PASSWORD_FILE", _secret(tmp_path, "a"))
    monkeypatch.setenv("FRDEMO_PASSWORD", "b")
    with pytest.raises(ConfigError, match="not both"):
        Demo()


def test_unreadable_file_names_the_setting_not_the_contents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FRDEMO_PASSWORD_FILE", str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="FRDEMO_PASSWORD_FILE: cannot read"):
        Demo()
    big = tmp_path / "big"
    big.write_bytes(b"x" * (2 << 20))
    monkeypatch.setenv("FRDEMO_PASSWORD_FILE", str(big))
    with pytest.raises(ConfigError, match="larger than"):
        Demo()


def test_non_secret_fields_have_no_file_variant(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FRDEMO_PLAIN_FILE", _secret(tmp_path, "y"))
    with pytest.raises(ConfigError, match=r"FRDEMO_PLAIN_FILE \(did you mean FRDEMO_PLAIN"):
        Demo()  # an unknown name of the service's own prefix is refused, never ignored
