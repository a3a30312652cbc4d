"""The Kubernetes API as the provider uses it: server-side apply, delete, list and watch
pods, through lightkube's ``AsyncClient``; every failure becomes one of the provider's
errors (:class:`~deploy.providers.base.ProviderError`, ``NoCapacityError`` for an
exceeded ResourceQuota) with one line that holds no Secret data.

Configuration: ``kubeconfig`` unset means in-cluster (the pod's service account) when
the orchestrator runs in a pod, else ``$KUBECONFIG`` or ``~/.kube/config``, as
lightkube's ``KubeConfig.from_env`` reads them; set, that file; ``context`` picks one
of its contexts (its current one by default).

Objects are applied with server-side apply (``PATCH`` with
``application/apply-patch+yaml``, ``fieldManager=<field_manager>``, ``force=true``):
the API server merges and records field ownership itself, so no
``last-applied-configuration`` annotation ever holds a copy of an object (a TLS
Secret's key stays in the Secret's ``data``), and forcing makes the orchestrator the
owner of every field it sets, as the controller of its pods should be.

Why lightkube, over kubernetes_asyncio and kr8s:

* it is async and built on httpx (``httpx2`` since lightkube 1.0, the same API as the
  httpx the project uses elsewhere): one HTTP stack, its TLS context, proxies from the
  environment, timeouts per request;
* server-side apply is a first-class call (``apply``/``patch`` with
  ``PatchType.APPLY``, ``field_manager``, ``force``), and ``watch`` takes a
  ``resource_version`` and reports a ``410 Gone`` as an ``ApiError`` the caller can act on
  (re-list), which is all :mod:`deploy.providers.kubernetes.watch` needs;
* it is small and typed (``py.typed``, dataclass models per API version), so
  ``mypy --strict`` checks the fields :mod:`~deploy.providers.kubernetes.pod_state`
  reads;
* kubernetes_asyncio is a generated port of the official client: a large aiohttp-based
  package (a second HTTP stack), untyped models, and server-side apply only through a
  raw patch call; kr8s is async too but object-oriented around kubectl-like verbs, with
  looser typing and an API still moving; neither adds what the provider needs.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx2
from lightkube import ApiError, AsyncClient, KubeConfig, NotReadyError
from lightkube import ConfigError as KubeConfigError
from lightkube.config.kubeconfig import SingleConfig
from lightkube.core.resource import NamespacedResource
from lightkube.resources.core_v1 import Pod, Secret, Service
from lightkube.resources.networking_v1 import NetworkPolicy
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.types import OnErrorAction, OnErrorResult, PatchType

from deploy.providers.base import NoCapacityError, ProviderError
from deploy.settings import KubernetesSettings
from framerelay.errors import ConfigError

KINDS: dict[tuple[str, str], type[NamespacedResource]] = {
    ("v1", "Secret"): Secret,
    ("v1", "Service"): Service,
    ("v1", "Pod"): Pod,
    ("networking.k8s.io/v1", "NetworkPolicy"): NetworkPolicy,
    ("policy/v1", "PodDisruptionBudget"): PodDisruptionBudget,
}
"""The kinds the provider applies, by (apiVersion, kind)."""
POD_OBJECTS: tuple[type[NamespacedResource], ...] = (Pod, Service, NetworkPolicy, Secret)
"""What one worker pod consists of; deleted together (the Pod first: it stops serving)."""
REQUEST_TIMEOUT_S = 15.0
WATCH_TIMEOUT_S = 300
"""The API server ends a watch after this long (``timeoutSeconds``); it is resumed from
its last resourceVersion, so a connection that died silently is found within it."""
_LONG_B64 = re.compile(r"[A-Za-z0-9+/=_-]{40,}")


def load_config(settings: KubernetesSettings) -> SingleConfig:
    """The cluster, user and context to talk to (see the module doc); ConfigError in one
    line when there is none."""
    where = str(settings.kubeconfig) if settings.kubeconfig else "in-cluster or $KUBECONFIG"
    try:
        kube = (
            KubeConfig.from_file(settings.kubeconfig)
            if settings.kubeconfig
            else KubeConfig.from_env()
        )
        config = kube.get(settings.context)
    except (KubeConfigError, KeyError, OSError, ValueError) as exc:
        raise ConfigError(
            f"the kubernetes provider found no usable configuration ({where}): {exc}; set "
            "FRAMERELAY_ORCH_KUBERNETES__KUBECONFIG (and __CONTEXT), or run in a pod"
        ) from None
    if config is None:
        raise ConfigError(f"the kubernetes provider found no context in {where}")
    return config


def redact(text: str) -> str:
    """An API answer as one line with any long base64 run (Secret data) masked."""
    return " ".join(_LONG_B64.sub("***", text).split())[:300]


def api_error(action: str, exc: httpx2.HTTPError) -> ProviderError:
    """The provider's error for a failed call (``action``: what was being done)."""
    if isinstance(exc, ApiError):
        status = exc.status
        message = redact(status.message or status.reason or "")
        if status.code == 403 and "exceeded quota" in message:
            return NoCapacityError(f"{action}: the namespace's ResourceQuota: {message}")
        return ProviderError(f"{action}: {status.code} {status.reason or ''}: {message}")
    if isinstance(exc, httpx2.HTTPStatusError):
        code = exc.response.status_code
        return ProviderError(f"{action}: HTTP {code}: {redact(exc.response.text)}")
    return ProviderError(f"{action}: the Kubernetes API did not answer: {type(exc).__name__}")


def is_gone(exc: BaseException) -> bool:
    """A ``410 Gone`` (``Expired``): the resourceVersion is too old to resume from."""
    return isinstance(exc, ApiError) and exc.status.code == 410


def _raise(exc: Exception, count: int) -> OnErrorResult:
    """Every watch error goes to the caller (which resumes or re-lists)."""
    return OnErrorResult(OnErrorAction.RAISE)


class KubeApi:
    """The API calls of the provider, in the settings' namespace."""

    def __init__(self, settings: KubernetesSettings) -> None:
        self.settings = settings
        self.namespace = settings.namespace
        config = load_config(settings)
        self.server = str(config.cluster.server)
        self._client = AsyncClient(
            config,
            namespace=settings.namespace,
            field_manager=settings.field_manager,
            timeout=httpx2.Timeout(REQUEST_TIMEOUT_S),
        )

    async def apply(self, obj: Mapping[str, Any]) -> Any:
        """Server-side apply of one rendered object; the object as the server has it."""
        kind = KINDS.get((str(obj.get("apiVersion")), str(obj.get("kind"))))
        name = str(obj["metadata"]["name"])
        if kind is None:
            raise ProviderError(f"cannot apply a {obj.get('kind')!r}: not a kind the provider owns")
        try:
            return await self._client.patch(
                kind,
                name,
                dict(obj),
                namespace=self.namespace,
                patch_type=PatchType.APPLY,
                field_manager=self.settings.field_manager,
                force=True,
            )
        except httpx2.HTTPError as exc:
            raise api_error(f"apply {kind.__name__}/{name}", exc) from None

    async def delete_pod_objects(self, name: str) -> list[str]:
        """Delete every object of pod ``name`` (:data:`POD_OBJECTS`, each named after the
        pod: no list needed, and the orchestrator's Role may not list Secrets, which would
        show it the CA and signing keys); what was deleted (``Kind/name``). Objects already
        gone are not an error."""
        deleted: list[str] = []
        for kind in POD_OBJECTS:
            try:
                await self._client.delete(kind, name, namespace=self.namespace)
            except ApiError as exc:
                if exc.status.code == 404:
                    continue
                raise api_error(f"delete {kind.__name__}/{name}", exc) from None
            except httpx2.HTTPError as exc:
                raise api_error(f"delete {kind.__name__}/{name}", exc) from None
            deleted.append(f"{kind.__name__}/{name}")
        return deleted

    async def list_pods(self, labels: Mapping[str, str]) -> tuple[list[Pod], str]:
        """The pods with ``labels`` and the list's resourceVersion (where a watch starts)."""
        try:
            found = self._client.list(Pod, namespace=self.namespace, labels=dict(labels))
            pods = [p async for p in found]
            return pods, found.resourceVersion
        except httpx2.HTTPError as exc:
            raise api_error("list Pod", exc) from None
        except NotReadyError:
            raise ProviderError("list Pod: the API server gave no resourceVersion") from None

    def watch_pods(
        self, labels: Mapping[str, str], resource_version: str
    ) -> AsyncIterator[tuple[str, Pod]]:
        """Pod events after ``resource_version``; raises the HTTP error as it came
        (:func:`is_gone` tells a 410) when the watch breaks."""
        events: AsyncIterator[tuple[str, Pod]] = aiter(
            self._client.watch(
                Pod,
                namespace=self.namespace,
                labels=dict(labels),
                resource_version=resource_version,
                server_timeout=WATCH_TIMEOUT_S,
                on_error=_raise,
            )
        )
        return events

    async def aclose(self) -> None:
        await self._client.aclose()
