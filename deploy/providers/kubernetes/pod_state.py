"""What a Kubernetes Pod object says, as the fleet's :class:`~deploy.models.PodStatus`
and one line of reason (pure: no I/O, no clock).

The orchestrator creates bare Pods (it is their controller), so a pod's own phase,
conditions and container states are the truth:

* ``PodScheduled=False``/``Unschedulable``: PROVISIONING with the scheduler's message
  (``unschedulable`` set; the provider turns it into NO_CAPACITY after its grace);
* a container waiting in ``ErrImagePull`` or ``ContainerCreating``: PROVISIONING with
  that reason; in ``ImagePullBackOff``, ``CrashLoopBackOff`` (the last exit said, e.g.
  ``OOMKilled``), a bad image name or container config, or just killed for memory
  (``OOMKilled``): ERROR, the pod will not serve as it is;
* ``Evicted``, a lost node (``NodeLost``, ``Ready`` Unknown, ``NodeNotReady``), a pod
  being deleted by someone else, or one whose containers ended: EXITED;
* ``Running``: RUNNING (the orchestrator's own probes and canaries decide when its
  workers take streams), with ``not Ready: ...`` as reason while Kubernetes' readiness
  probe has not passed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lightkube.models.core_v1 import ContainerState, ContainerStatus, PodCondition
from lightkube.resources.core_v1 import Pod

from deploy.models import PodStatus

REASON_CHARS = 300
"""A reason is cut to this many characters (it is shown in one table cell)."""
NEVER_SERVES = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
"""Container waiting reasons after which the pod will not serve without a change: ERROR
(the fleet replaces it at once, within its replacement budget, the reason in the event).
``ErrImagePull`` (a first failed pull, retried) is not one of them."""
NODE_GONE = frozenset({"NodeLost", "NodeNotReady"})
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class PodState:
    status: PodStatus
    reason: str | None = None
    """One line: why the pod is not simply serving (None: nothing to say)."""
    unschedulable: bool = False
    """The scheduler found no node for it (``PodScheduled=False``, ``Unschedulable``)."""


def one_line(*parts: str | None) -> str:
    """``parts`` joined by ': ', whitespace collapsed, cut to :data:`REASON_CHARS`."""
    text = ": ".join(p for p in parts if p)
    text = _SPACES.sub(" ", text).strip()
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"


def pod_state(pod: Pod) -> PodState:
    """The fleet's view of one Pod object (see the module doc for the rules)."""
    gone = _gone(pod)
    if gone is not None:
        return gone
    status = pod.status
    phase = (status.phase if status else None) or "Pending"
    broken = _containers_broken(_containers(pod))
    if broken is not None:
        return PodState(PodStatus.ERROR, broken)
    if phase == "Running":
        ready = _condition(pod, "Ready")
        if ready is not None and ready.status == "True":
            return PodState(PodStatus.RUNNING)
        why = (ready.message or ready.reason) if ready is not None else None
        return PodState(PodStatus.RUNNING, one_line("not Ready", why or "readiness probe"))
    return _pending(pod)


def _gone(pod: Pod) -> PodState | None:
    """EXITED when the pod ended, was evicted, lost its node or is being deleted."""
    status = pod.status
    phase = status.phase if status else None
    reason = status.reason if status else None
    message = status.message if status else None
    if phase == "Failed" or reason in NODE_GONE:
        what = "node lost" if reason in NODE_GONE else (reason or "Failed")
        return PodState(PodStatus.EXITED, one_line(what, message or _last_exit(pod)))
    if phase == "Succeeded":
        return PodState(PodStatus.EXITED, one_line("exited", _last_exit(pod) or "completed"))
    ready = _condition(pod, "Ready")
    if ready is not None and (ready.status == "Unknown" or ready.reason in NODE_GONE):
        return PodState(PodStatus.EXITED, one_line("node lost", ready.message or ready.reason))
    if pod.metadata is not None and pod.metadata.deletionTimestamp is not None:
        target = _condition(pod, "DisruptionTarget")
        why = (target.reason or target.message) if target is not None else None
        return PodState(PodStatus.EXITED, one_line("deleted", why or "its deletion began"))
    return None


def _pending(pod: Pod) -> PodState:
    """Not running yet: unschedulable, or waiting for a node, an image, a container."""
    scheduled = _condition(pod, "PodScheduled")
    if scheduled is not None and scheduled.status == "False":
        if scheduled.reason == "Unschedulable":
            why = one_line("Unschedulable", scheduled.message or "no node fits")
            return PodState(PodStatus.PROVISIONING, why, unschedulable=True)
        return PodState(PodStatus.PROVISIONING, one_line(scheduled.reason, scheduled.message))
    for container in _containers(pod):
        waiting = container.state.waiting if container.state else None
        if waiting is not None and waiting.reason:
            return PodState(PodStatus.PROVISIONING, one_line(waiting.reason, waiting.message))
    if scheduled is None or scheduled.status != "True":
        return PodState(PodStatus.PROVISIONING, "Pending: waiting for the scheduler")
    node = pod.spec.nodeName if pod.spec is not None else None
    return PodState(PodStatus.PROVISIONING, one_line("Pending", f"scheduled on {node}"))


def _containers_broken(containers: list[ContainerStatus]) -> str | None:
    """Why a container will not serve as it is (None: none is broken)."""
    for container in containers:
        waiting = container.state.waiting if container.state else None
        if waiting is not None and waiting.reason in NEVER_SERVES:
            if waiting.reason == "CrashLoopBackOff":
                last = _exit(container.lastState) or "it keeps exiting"
                return one_line("CrashLoopBackOff", f"{last}, {container.restartCount} restarts")
            return one_line(waiting.reason, waiting.message)
        ended = container.state.terminated if container.state else None
        if ended is not None and ended.reason == "OOMKilled":
            return one_line("OOMKilled", "the worker went over its memory limit")
    return None


def _exit(state: ContainerState | None) -> str | None:
    """``last exit OOMKilled (exit code 137)``; None without a terminated state."""
    ended = state.terminated if state is not None else None
    if ended is None:
        return None
    return f"last exit {ended.reason or 'Error'} (exit code {ended.exitCode})"


def _last_exit(pod: Pod) -> str | None:
    for container in _containers(pod):
        said = _exit(container.state) or _exit(container.lastState)
        if said:
            return said
    return None


def _containers(pod: Pod) -> list[ContainerStatus]:
    status = pod.status
    return list(status.containerStatuses or []) if status is not None else []


def _condition(pod: Pod, kind: str) -> PodCondition | None:
    conditions = pod.status.conditions if pod.status is not None else None
    return next((c for c in conditions or [] if c.type == kind), None)
