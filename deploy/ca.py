"""The orchestrator's small certificate authority for pod (worker) certificates.

Every pod the fleet creates gets its own short-lived server certificate (EC
P-256, SAN DNS ``<pod>.pods.framerelay``, plus 127.0.0.1 for local pods),
signed by this CA. The ingest and the canary verify pods against ``ca.pem``
and the name the orchestrator tells them (``server_hostname``), so a pod
cannot pose as another.

The CA lives in ``ca_dir``: ``ca.pem`` (public, 0644) and ``ca.key`` (0600),
the folder 0700 when this module creates it. An existing CA is loaded as it
is (a Kubernetes Secret, a shared volume); a ``ca.key`` that others may read
is refused.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from framerelay.errors import ConfigError

CA_CERT = "ca.pem"
CA_KEY = "ca.key"
CA_YEARS = 10
SKEW = dt.timedelta(minutes=5)
"""Certificates start this long before now (clock skew between hosts)."""
MAX_TTL_S = 90 * 86_400.0


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write a new file with ``mode`` from the start (never briefly readable by others)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)  # umask may have narrowed it; never widened
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class PodCA:
    """Issues pod certificates; ``cert_pem`` / ``cert_path`` are the public CA certificate."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate, path: Path) -> None:
        self._key = key
        self.cert = cert
        self.cert_path = path

    def __repr__(self) -> str:  # never the key
        return f"PodCA({self.cert.subject.rfc4514_string()!r}, {str(self.cert_path)!r})"

    @property
    def cert_pem(self) -> str:
        return self.cert.public_bytes(serialization.Encoding.PEM).decode()

    @classmethod
    def load_or_create(
        cls, ca_dir: Path, *, name: str = "framerelay pod CA", group_readable: bool = False
    ) -> PodCA:
        """The CA in ``ca_dir``, created there on first use. Its key must be readable by its
        owner alone, or also by its group when ``group_readable`` (a Kubernetes Secret
        mounted 0440 for the pod's fsGroup)."""
        key_path, cert_path = ca_dir / CA_KEY, ca_dir / CA_CERT
        if not ca_dir.exists():
            ca_dir.mkdir(mode=0o700, parents=True)
            os.chmod(ca_dir, 0o700)
        if key_path.exists():
            key = _load_key(key_path, group_readable)
        else:
            key = ec.generate_private_key(ec.SECP256R1())
            try:
                _write(key_path, _key_pem(key), 0o600)
            except OSError as exc:
                raise ConfigError(
                    f"cannot write the CA key in {str(ca_dir)!r}: {exc.strerror}"
                ) from None
        if cert_path.exists():
            cert = _load_cert(cert_path)
            if _spki(cert.public_key()) != _spki(key.public_key()):
                raise ConfigError(f"{cert_path} does not belong to {key_path}")
        else:
            cert = _self_signed(key, name)
            _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
        return cls(key, cert, cert_path)

    def issue(
        self,
        name: str,
        dns_names: Sequence[str],
        ip_addresses: Sequence[str] = (),
        ttl_s: float = 72 * 3600.0,
    ) -> tuple[str, str]:
        """(certificate PEM, private key PEM) of a new server certificate for ``name``."""
        if not dns_names and not ip_addresses:
            raise ConfigError(f"a certificate for {name!r} needs at least one DNS name or IP")
        if not 60 <= ttl_s <= MAX_TTL_S:
            raise ConfigError(f"pod certificate lifetime must be 60 s .. {MAX_TTL_S:.0f} s")
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        now = _now()
        ca_ski = self.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:64])]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - SKEW)
            .not_valid_after(now + dt.timedelta(seconds=ttl_s))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), False
            )
            .sign(self._key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM).decode(), _key_pem(key).decode()

    def signed(self, cert: x509.Certificate) -> bool:
        """True when ``cert`` was issued by this CA (its signature checks out)."""
        try:
            cert.verify_directly_issued_by(self.cert)
        except (ValueError, TypeError, InvalidSignature):
            return False
        return True


def _spki(key: object) -> bytes:
    public_bytes = getattr(key, "public_bytes", None)
    if public_bytes is None:
        return b""
    data: bytes = public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return data


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=cert_sign,
        crl_sign=cert_sign, encipher_only=False, decipher_only=False,
    )  # fmt: skip


def _self_signed(key: ec.EllipticCurvePrivateKey, name: str) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW)
        .not_valid_after(now + dt.timedelta(days=365 * CA_YEARS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), False)
        .sign(key, hashes.SHA256())
    )


def _load_key(path: Path, group_readable: bool) -> ec.EllipticCurvePrivateKey:
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXO | stat.S_IWGRP | stat.S_IXGRP):
        raise ConfigError(
            f"{path} may be read or written by other users (mode {stat.filemode(mode)}); "
            f"run: chmod 600 {path}"
        )
    if mode & stat.S_IRGRP and not group_readable:
        raise ConfigError(
            f"{path} may be read by its group (mode {stat.filemode(mode)}); run: chmod 600 "
            f"{path} (or, for a Kubernetes Secret mounted 0440 for the pod's fsGroup, set "
            "FRAMERELAY_ORCH_CA_KEY_GROUP_READABLE=true)"
        )
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        raise ConfigError(f"{path} is not a readable, unencrypted PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{path}: the CA key must be an EC (P-256) key")
    return key


def _load_cert(path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        raise ConfigError(f"{path} is not a readable PEM certificate") from None
