"""The ``kubernetes`` provider: each pod of the fleet is a bare Pod, the orchestrator its
controller, with a TLS Secret, a Service and a NetworkPolicy of its own
(:mod:`~deploy.providers.kubernetes.render`), all server-side applied through the API
(:mod:`~deploy.providers.kubernetes.client`), and per tier a PodDisruptionBudget.

Pods are read from a watch's cache (:mod:`~deploy.providers.kubernetes.watch`), not asked
for every tick, and judged by :mod:`~deploy.providers.kubernetes.pod_state`. A pod the
scheduler cannot place for ``unschedulable_grace_s`` (the orchestrator's clock) is
:attr:`~deploy.models.PodStatus.NO_CAPACITY`: the fleet deletes it and sends the tier's
demand elsewhere, as on a "no capacity" answer to a create. A worker is reached at its
Service (``<pod>.<namespace>.svc:8443+k``) or, with ``address: pod-ip``, at the pod's IP.

Terminating a pod deletes all its objects (each named after the pod); a pod that
goes by itself (evicted, its node lost and collected) has its other objects deleted when
the watch reports it gone, so no pod's TLS Secret outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from lightkube.resources.core_v1 import Pod

from deploy.clock import Clock, SystemClock
from deploy.models import Endpoint, PodInfo, PodSpec, PodStatus, tls_server_name
from deploy.providers.base import GpuPrice, ProviderError
from deploy.providers.kubernetes.client import KubeApi
from deploy.providers.kubernetes.pod_state import one_line, pod_state
from deploy.providers.kubernetes.render import (
    MANAGED,
    render_disruption_budget,
    render_pod_objects,
    worker_ports,
)
from deploy.providers.kubernetes.watch import PodWatch, pod_name
from deploy.settings import KubernetesSettings, TierConfig

log = logging.getLogger(__name__)
SYNC_TIMEOUT_S = 20.0
"""The first list of pods must come within this long, or the pass fails (and retries)."""
STALE_S = 30.0
"""The pod watch failing for longer than this fails the pass instead of acting on a
cache that may be out of date."""


def warm_floor(tier: TierConfig) -> int:
    """The ``minAvailable`` of a tier's PodDisruptionBudget: the pods a voluntary
    disruption (a node drain, the cluster autoscaler or Karpenter consolidating nodes) may
    not take the tier below. Its warm minimum outside windows: the warm pool is the
    capacity the operator pays to keep, and the workers above it (demand, windows) may
    go, their streams moved by the orchestrator. None for a batch-only tier with windows
    (its pods serve the window's work; the next window brings them back)."""
    if tier.batch_only and tier.windows:
        return 0
    return min(tier.max_workers, tier.min_warm)


class KubernetesProvider:
    name = "kubernetes"

    def __init__(
        self,
        settings: KubernetesSettings,
        clock: Clock | None = None,
        tiers: Sequence[TierConfig] = (),
    ) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.floors = {t.name: warm_floor(t) for t in tiers}
        self.api = KubeApi(settings)  # a missing or bad kubeconfig: ConfigError now
        self.watch = PodWatch(self.api, MANAGED, on_deleted=self._gone)
        self._unschedulable: dict[str, float] = {}
        """Pod -> when it was first seen unschedulable (the orchestrator's clock)."""
        self._failing_since: float | None = None
        self._deleting: set[str] = set()
        self._budgets: set[str] = set()
        self._sweeps: set[asyncio.Task[None]] = set()

    def cert_names(self, name: str) -> tuple[list[str], list[str]]:
        """Extra names in a pod's certificate: its Service's DNS name."""
        return [f"{name}.{self.settings.namespace}.svc"], []

    async def create(self, spec: PodSpec) -> PodInfo:
        """Apply the pod's objects in order (Secret, NetworkPolicy, Service, Pod) and its
        tier's disruption budget; applying again after a failure is harmless."""
        self.watch.start()
        await self._budget(spec.tier)
        applied: Pod | None = None
        for obj in render_pod_objects(spec, self.settings):
            answer = await self.api.apply(obj)
            if isinstance(answer, Pod):
                applied = answer
        if applied is None:
            raise ProviderError(f"the rendering of {spec.name} has no Pod")
        self._deleting.discard(spec.name)
        self.watch.created(applied)
        info = self._info(applied, self.clock.now())
        info.spot = spec.spot
        return info

    async def _budget(self, tier: str) -> None:
        """The tier's PodDisruptionBudget, once per tier and process; a failure is logged
        and tried again at the next create (the pods do not depend on it)."""
        if tier in self._budgets:
            return
        budget = render_disruption_budget(tier, self.floors.get(tier, 0), self.settings)
        try:
            await self.api.apply(budget)
        except ProviderError as exc:
            log.warning("the disruption budget of tier %s was not applied: %s", tier, exc)
            return
        self._budgets.add(tier)

    async def get(self, pod_id: str) -> PodInfo | None:
        pods = await self._pods()
        pod = pods.get(pod_id)
        if pod is None or pod_id in self._deleting:
            return None
        return self._info(pod, self.clock.now())

    async def list(self) -> list[PodInfo]:
        pods = await self._pods()
        self._deleting &= set(pods)
        self._unschedulable = {k: t for k, t in self._unschedulable.items() if k in pods}
        now = self.clock.now()
        return [self._info(p, now) for name, p in pods.items() if name not in self._deleting]

    async def stop(self, pod_id: str) -> None:
        """A bare Pod cannot be stopped and kept: it is deleted."""
        await self.terminate(pod_id)

    async def terminate(self, pod_id: str) -> None:
        """Delete the pod and its Service, NetworkPolicy and Secret (gone already: fine)."""
        self._deleting.add(pod_id)
        self.watch.forget(pod_id)
        self._unschedulable.pop(pod_id, None)
        await self.api.delete_pod_objects(pod_id)

    async def prices(self) -> dict[str, GpuPrice]:
        return {}

    async def aclose(self) -> None:
        await self.watch.aclose()
        for task in list(self._sweeps):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.api.aclose()

    # -- reading pods ----------------------------------------------------------

    async def _pods(self) -> dict[str, Pod]:
        """The watch's pods, once it has listed them and unless it has failed too long."""
        self.watch.start()
        try:
            async with asyncio.timeout(SYNC_TIMEOUT_S):
                await self.watch.synced.wait()
        except TimeoutError:
            why = self.watch.failing or "no answer"
            raise ProviderError(
                f"no pod list from the Kubernetes API at {self.api.server} within "
                f"{SYNC_TIMEOUT_S:.0f} s: {why}"
            ) from None
        now, broken = self.clock.now(), self.watch.broken
        if broken is None:
            self._failing_since = None
        elif self._failing_since is None:
            self._failing_since = now
        elif now - self._failing_since > STALE_S:
            raise ProviderError(
                f"the pod watch has failed for {now - self._failing_since:.0f} s: {broken}"
            )
        return self.watch.pods

    def _info(self, pod: Pod, now: float) -> PodInfo:
        name = pod_name(pod)
        state = pod_state(pod)
        status, reason = state.status, state.reason
        if state.unschedulable:
            since = self._unschedulable.setdefault(name, now)
            if now - since >= self.settings.unschedulable_grace_s:
                status = PodStatus.NO_CAPACITY
                reason = one_line(f"no node for {now - since:.0f} s", reason)
        else:
            self._unschedulable.pop(name, None)
        info = PodInfo(id=name, name=name, status=status, gpu_type="kubernetes", reason=reason)
        if status is PodStatus.RUNNING:
            endpoints = self._endpoints(pod)
            if not endpoints:
                info.status, info.reason = PodStatus.PROVISIONING, "Running: no pod IP yet"
                return info
            info.set_endpoints(endpoints)
            info.tls_server_name = tls_server_name(name) if self.settings.tls else None
        return info

    def _endpoints(self, pod: Pod) -> tuple[Endpoint, ...]:
        """Where each worker answers: its Service's name, or the pod's IP (``address``)."""
        if self.settings.address == "pod-ip":
            host = pod.status.podIP if pod.status is not None else None
        else:
            host = f"{pod_name(pod)}.{self.settings.namespace}.svc"
        if not host:
            return ()
        ws, http = ("wss", "https") if self.settings.tls else ("ws", "http")
        return tuple(
            Endpoint(f"{ws}://{host}:{port}/v1/tunnel", f"{http}://{host}:{port}")
            for port in worker_ports(pod.to_dict())
        )

    def _gone(self, name: str) -> None:
        """The watch saw the pod deleted: its other objects go too (unless this provider
        is deleting them already)."""
        self._unschedulable.pop(name, None)
        if name in self._deleting:
            self._deleting.discard(name)
            return
        task = asyncio.get_running_loop().create_task(self._sweep(name))
        self._sweeps.add(task)
        task.add_done_callback(self._sweeps.discard)

    async def _sweep(self, name: str) -> None:
        try:
            deleted = await self.api.delete_pod_objects(name)
        except ProviderError as exc:
            log.warning("the objects of gone pod %s were not deleted: %s", name, exc)
            return
        if deleted:
            log.info("pod %s went by itself; deleted %s", name, ", ".join(deleted))
