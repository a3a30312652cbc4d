"""The pod CA: created private on first use, loaded as it is afterwards, issues
certificates Python's ssl verifies by name (strict X.509 checks on)."""

from __future__ import annotations

import datetime as dt
import os
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509

from deploy.ca import PodCA
from framerelay.errors import ConfigError
from tests.support.tls_handshake import handshake, sans, tls_server


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_created_private_then_loaded_unchanged(tmp_path: Path) -> None:
    folder = tmp_path / "ca"
    ca = PodCA.load_or_create(folder)
    assert _mode(folder) == 0o700
    assert _mode(folder / "ca.key") == 0o600 and _mode(folder / "ca.pem") == 0o644
    again = PodCA.load_or_create(folder)
    assert again.cert_pem == ca.cert_pem and again.cert_path == folder / "ca.pem"
    assert "BEGIN" not in repr(ca)
    basic = ca.cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert basic.ca


def test_a_ca_key_others_can_read_is_refused(tmp_path: Path) -> None:
    PodCA.load_or_create(tmp_path / "ca")
    os.chmod(tmp_path / "ca" / "ca.key", 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        PodCA.load_or_create(tmp_path / "ca")


@pytest.mark.parametrize("mode", [0o640, 0o440, 0o660, 0o604])
def test_a_ca_key_its_group_can_read_is_refused_unless_allowed(tmp_path: Path, mode: int) -> None:
    """Issue 28: a group-readable ca.key loaded; now only when the operator says the group
    is the pod's own (a Kubernetes Secret mounted 0440 for its fsGroup)."""
    PodCA.load_or_create(tmp_path / "ca")
    os.chmod(tmp_path / "ca" / "ca.key", mode)
    with pytest.raises(ConfigError, match="chmod 600") as refused:
        PodCA.load_or_create(tmp_path / "ca")
    assert "\n" not in str(refused.value)
    if mode in (0o640, 0o440):
        assert "FRAMERELAY_ORCH_CA_KEY_GROUP_READABLE" in str(refused.value)
        PodCA.load_or_create(tmp_path / "ca", group_readable=True)
    else:  # writable by the group or readable by others: never
        with pytest.raises(ConfigError):
            PodCA.load_or_create(tmp_path / "ca", group_readable=True)


def test_a_certificate_of_another_ca_is_refused(tmp_path: Path) -> None:
    PodCA.load_or_create(tmp_path / "a")
    PodCA.load_or_create(tmp_path / "b")
    (tmp_path / "a" / "ca.pem").write_bytes((tmp_path / "b" / "ca.pem").read_bytes())
    with pytest.raises(ConfigError, match="does not belong"):
        PodCA.load_or_create(tmp_path / "a")


def test_issued_certificates_verify_by_name_only(tmp_path: Path) -> None:
    ca = PodCA.load_or_create(tmp_path / "ca")
    cert_pem, key_pem = ca.issue("fr-a-0-g0", ["fr-a-0-g0.pods.framerelay"], ["127.0.0.1"], 3600)
    other_pem, _ = ca.issue("fr-a-1-g0", ["fr-a-1-g0.pods.framerelay"], [], 3600)
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    other = x509.load_pem_x509_certificate(other_pem.encode())
    assert cert.serial_number != other.serial_number
    assert sans(cert) == (["fr-a-0-g0.pods.framerelay"], ["127.0.0.1"])
    assert ca.signed(cert) and ca.signed(other)
    left = cert.not_valid_after_utc - dt.datetime.now(dt.UTC)
    assert dt.timedelta(minutes=59) < left <= dt.timedelta(hours=1)
    with tls_server(cert_pem, key_pem, tmp_path / "srv") as port:
        seen = handshake(port, ca.cert_path, "fr-a-0-g0.pods.framerelay")
        assert seen.serial_number == cert.serial_number
        handshake(port, ca.cert_path, "127.0.0.1")
        with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
            handshake(port, ca.cert_path, "fr-a-1-g0.pods.framerelay")  # another pod's name
        stranger = PodCA.load_or_create(tmp_path / "stranger")
        with pytest.raises(ssl.SSLCertVerificationError):
            handshake(port, stranger.cert_path, "fr-a-0-g0.pods.framerelay")  # another CA


def test_issue_refuses_nonsense(tmp_path: Path) -> None:
    ca = PodCA.load_or_create(tmp_path / "ca")
    with pytest.raises(ConfigError, match="DNS name or IP"):
        ca.issue("x", [], [])
    with pytest.raises(ConfigError, match="lifetime"):
        ca.issue("x", ["x"], [], ttl_s=10)
