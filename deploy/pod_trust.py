"""Who holds what: the keys and certificate each pod the fleet creates gets.

* Every pod gets the **public** key set (``FRAMERELAY_WORKER_TUNNEL_KEYS``):
  it verifies tunnel tokens and can mint none. Never ``FRAMERELAY_SIGNING_KEYS``
  nor the token secrets - except local pods (same host) when the orchestrator
  has only HS256 secrets, which have no public half.
* With TLS on, every pod gets its own certificate from the orchestrator's CA
  (``FRAMERELAY_WORKER_TLS_CERT_PEM`` / ``FRAMERELAY_WORKER_TLS_KEY_PEM`` in
  its secret env; each provider delivers them its own way), named
  ``<pod>.pods.framerelay``: the ingest and the canary verify that name.
* Remote providers (RunPod, Kubernetes) refuse to start with only HS256
  secrets (the pods would hold a key that mints) and, unless
  ``allow_insecure``, without TLS.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import SecretStr

from deploy.ca import PodCA
from deploy.models import tls_server_name
from deploy.providers.base import Provider
from deploy.settings import OrchestratorSettings
from framerelay.auth import KeySet
from framerelay.errors import ConfigError

log = logging.getLogger(__name__)
REMOTE_PROVIDERS = frozenset({"runpod", "kubernetes"})
TUNNEL_KEYS_ENV = "FRAMERELAY_WORKER_TUNNEL_KEYS"
TOKEN_SECRETS_ENV = "FRAMERELAY_TOKEN_SECRETS"  # noqa: S105 - a variable name
TLS_CERT_PEM_ENV = "FRAMERELAY_WORKER_TLS_CERT_PEM"
TLS_KEY_PEM_ENV = "FRAMERELAY_WORKER_TLS_KEY_PEM"
CertNames = Callable[[str], tuple[list[str], list[str]]]
"""pod name -> (extra DNS names, IP addresses) for its certificate."""


@dataclass(frozen=True, slots=True)
class PodCredentials:
    """What one pod is given: plain env, secret env, and the name its certificate has."""

    env: dict[str, str] = field(default_factory=dict)
    secret_env: dict[str, SecretStr] = field(default_factory=dict)
    tls_server_name: str | None = None


def _no_extra_names(name: str) -> tuple[list[str], list[str]]:
    return [], []


class PodTrust:
    """Hands out a pod's credentials; ``worker_keys`` mint the canary's tunnel tokens."""

    def __init__(
        self,
        keys: KeySet,
        *,
        ca: PodCA | None = None,
        cert_ttl_s: float = 72 * 3600.0,
        shared_secrets: SecretStr | None = None,
        cert_names: CertNames = _no_extra_names,
    ) -> None:
        public = keys.public()
        self.ca = ca
        self.cert_ttl_s = cert_ttl_s
        self._cert_names = cert_names
        self._env: dict[str, str] = {}
        self._secret_env: dict[str, SecretStr] = {}
        if len(public):
            self._env[TUNNEL_KEYS_ENV] = public.to_json()
            self.worker_keys = KeySet(k for k in keys if not k.symmetric)
        elif shared_secrets is not None:  # HS256 only: same host only (checked by the caller)
            self._secret_env[TOKEN_SECRETS_ENV] = shared_secrets
            self.worker_keys = keys
        else:  # HS256 keys given as a JWKS
            self._secret_env[TUNNEL_KEYS_ENV] = SecretStr(keys.to_json())
            self.worker_keys = keys

    @property
    def tls(self) -> bool:
        return self.ca is not None

    @property
    def pods_hold_signing_keys(self) -> bool:
        """True when pods get shared HS256 secrets (allowed for local pods only)."""
        return bool(self._secret_env)

    def for_pod(self, name: str) -> PodCredentials:
        secret_env = dict(self._secret_env)
        server_name = None
        if self.ca is not None:
            server_name = tls_server_name(name)
            dns, ips = self._cert_names(name)
            cert, key = self.ca.issue(name, [server_name, *dns], ips, self.cert_ttl_s)
            secret_env[TLS_CERT_PEM_ENV] = SecretStr(cert)
            secret_env[TLS_KEY_PEM_ENV] = SecretStr(key)
        return PodCredentials(dict(self._env), secret_env, server_name)


def provider_tls(provider: Provider) -> tuple[bool, bool]:
    """(tls, allow_insecure) of a provider's settings (no settings: no TLS)."""
    settings = getattr(provider, "settings", None)
    return bool(getattr(settings, "tls", False)), bool(getattr(settings, "allow_insecure", False))


def check_remote(provider: Provider, keys: KeySet) -> None:
    """Refuse what would put a minting key or plain ws:// on a rented machine."""
    if provider.name not in REMOTE_PROVIDERS:
        return
    if not len(keys.public()):
        raise ConfigError(
            f"the {provider.name} provider needs asymmetric signing keys: with only HS256 "
            "secrets every rented pod would hold a key that mints tokens. Create a key set "
            "with 'framerelay keys generate' and set FRAMERELAY_SIGNING_KEYS_FILE (pods get "
            "only its public half)"
        )
    tls, allow_insecure = provider_tls(provider)
    if tls:
        return
    var = f"FRAMERELAY_ORCH_{provider.name.upper()}__ALLOW_INSECURE"
    if not allow_insecure:
        raise ConfigError(
            f"the {provider.name} provider has tls=false: the tunnel to rented pods would be "
            f"plain ws://. Turn TLS on, or set {var}=true to accept that"
        )
    log.warning(
        "%s pods run WITHOUT TLS (allow_insecure): frames and tokens cross the network in clear",
        provider.name,
    )


def make_trust(settings: OrchestratorSettings, keys: KeySet, provider: Provider) -> PodTrust:
    check_remote(provider, keys)
    tls, _ = provider_tls(provider)
    ca = (
        PodCA.load_or_create(settings.ca_dir, group_readable=settings.ca_key_group_readable)
        if tls
        else None
    )
    names: CertNames = getattr(provider, "cert_names", _no_extra_names)
    return PodTrust(
        keys,
        ca=ca,
        cert_ttl_s=settings.pod_cert_ttl_h * 3600.0,
        shared_secrets=settings.token_secrets,
        cert_names=names,
    )
