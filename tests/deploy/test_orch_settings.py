"""Orchestrator settings: secrets from files (Docker/Kubernetes secrets), TLS pairs,
and remote providers' TLS on by default."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

from deploy.settings import GpuTypeConfig, OrchestratorSettings, TierConfig
from framerelay.auth import KeySet
from tests.support.auth import ed_keys


def test_signing_keys_and_the_runpod_key_come_from_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = ed_keys()
    (tmp_path / "signing.jwks").write_text(keys.to_json())
    (tmp_path / "runpod").write_text("rpa_from_a_file\n")
    monkeypatch.setenv("FRAMERELAY_SIGNING_KEYS_FILE", str(tmp_path / "signing.jwks"))
    monkeypatch.setenv("FRAMERELAY_ORCH_RUNPOD__API_KEY_FILE", str(tmp_path / "runpod"))
    monkeypatch.setenv("FRAMERELAY_ORCH_CA_DIR", str(tmp_path / "ca"))
    s = OrchestratorSettings()
    assert s.signing_keys is not None
    assert KeySet.from_json(s.signing_keys.get_secret_value()).kids == keys.kids
    assert s.runpod.api_key is not None and s.runpod.api_key.get_secret_value() == "rpa_from_a_file"
    assert s.ca_dir == tmp_path / "ca"
    assert str(keys.to_jwks()["keys"][0]["d"]) not in repr(s)


def test_defaults_tls_on_for_remote_providers() -> None:
    s = OrchestratorSettings()
    assert s.runpod.tls and not s.runpod.allow_insecure
    assert s.kubernetes.tls and not s.kubernetes.allow_insecure
    assert not s.local.tls and not s.metrics_auth
    assert s.token_leeway_s == 30 and s.pod_cert_ttl_h == 72


def test_tls_files_go_in_pairs(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="tls_cert and tls_key"):
        OrchestratorSettings(tls_cert=tmp_path / "c.pem")
    with pytest.raises(ValidationError, match="mTLS"):
        OrchestratorSettings(tls_client_ca=tmp_path / "ca.pem")


def test_the_old_spot_names_are_read_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 29: a tier's ``spot`` is now ``interruptible`` (RunPod has no spot pods; only
    providers that have such capacity use it); the old names are read for one release."""
    caplog.set_level(logging.WARNING, "deploy.settings")
    tier = TierConfig.model_validate({"name": "cheap", "spot": True})
    assert tier.interruptible
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "tier cheap: 'spot' is renamed 'interruptible'; the old name is read until the next release"
    ]
    gpu = GpuTypeConfig.model_validate({"vram_gb": 24, "spot_usd_per_hr": 0.1})
    assert gpu.interruptible_usd_per_hr == 0.1
    with pytest.raises(ValidationError, match="give 'interruptible' alone"):
        TierConfig.model_validate({"name": "x", "spot": True, "interruptible": False})
    assert [t.name for t in OrchestratorSettings().tiers] == ["ondemand", "community"]
    assert not any(t.interruptible for t in OrchestratorSettings().tiers)
