"""Issue 31: a Pod object as the fleet sees it (:mod:`deploy.providers.kubernetes.pod_state`),
table-driven over the states a real cluster reports: the phases, conditions and container
states as the Kubernetes API documents them (core/v1 PodStatus)."""

from __future__ import annotations

from typing import Any

import pytest
from lightkube.resources.core_v1 import Pod

from deploy.models import PodStatus
from deploy.providers.kubernetes.pod_state import REASON_CHARS, PodState, one_line, pod_state

SCHEDULER_SAYS = (
    "0/3 nodes are available: 3 node(s) had untolerated taint {nvidia.com/gpu: present}. "
    "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
)


def cond(kind: str, status: str, reason: str | None = None, message: str | None = None) -> Any:
    out: dict[str, Any] = {"type": kind, "status": status}
    if reason:
        out["reason"] = reason
    if message:
        out["message"] = message
    return out


def container(
    state: dict[str, Any],
    *,
    ready: bool = False,
    restarts: int = 0,
    last: dict[str, Any] | None = None,
) -> dict[str, Any]:
    out = {
        "name": "worker",
        "image": "w:1",
        "imageID": "",
        "ready": ready,
        "restartCount": restarts,
        "state": state,
    }
    if last is not None:
        out["lastState"] = last
    return out


def pod(
    phase: str | None,
    *,
    conditions: tuple[Any, ...] = (),
    containers: tuple[dict[str, Any], ...] = (),
    deleting: bool = False,
    **status: Any,
) -> Pod:
    meta: dict[str, Any] = {"name": "fr-gpu-0-g0", "namespace": "framerelay"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-07T10:00:00Z"
    body: dict[str, Any] = {**status, "conditions": list(conditions)}
    if phase:
        body["phase"] = phase
    if containers:
        body["containerStatuses"] = list(containers)
    spec = {"containers": [{"name": "worker"}], "nodeName": "gpu-a"}
    obj = Pod.from_dict(
        {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": body}
    )
    assert isinstance(obj, Pod)
    return obj


SCHEDULED = cond("PodScheduled", "True")
RUNNING_STATE = {"running": {"startedAt": "2026-12-07T10:00:00Z"}}
OOM = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}

CASES: list[tuple[str, Pod, PodState]] = [
    (
        "fresh pod: no status yet",
        pod(None),
        PodState(PodStatus.PROVISIONING, "Pending: waiting for the scheduler"),
    ),
    (
        "unschedulable: the scheduler's message",
        pod(
            "Pending", conditions=(cond("PodScheduled", "False", "Unschedulable", SCHEDULER_SAYS),)
        ),
        PodState(PodStatus.PROVISIONING, f"Unschedulable: {SCHEDULER_SAYS}", unschedulable=True),
    ),
    (
        "scheduling gated",
        pod(
            "Pending",
            conditions=(cond("PodScheduled", "False", "SchedulingGated", "waiting for quota"),),
        ),
        PodState(PodStatus.PROVISIONING, "SchedulingGated: waiting for quota"),
    ),
    (
        "scheduled, container being created",
        pod(
            "Pending",
            conditions=(SCHEDULED,),
            containers=(container({"waiting": {"reason": "ContainerCreating"}}),),
        ),
        PodState(PodStatus.PROVISIONING, "ContainerCreating"),
    ),
    (
        "scheduled, no container status yet",
        pod("Pending", conditions=(SCHEDULED,)),
        PodState(PodStatus.PROVISIONING, "Pending: scheduled on gpu-a"),
    ),
    (
        "first failed pull: retried, still provisioning",
        pod(
            "Pending",
            conditions=(SCHEDULED,),
            containers=(
                container({"waiting": {"reason": "ErrImagePull", "message": "manifest unknown"}}),
            ),
        ),
        PodState(PodStatus.PROVISIONING, "ErrImagePull: manifest unknown"),
    ),
    (
        "image pull back-off: will not serve",
        pod(
            "Pending",
            conditions=(SCHEDULED,),
            containers=(
                container(
                    {
                        "waiting": {
                            "reason": "ImagePullBackOff",
                            "message": 'Back-off pulling image "w:1"',
                        }
                    }
                ),
            ),
        ),
        PodState(PodStatus.ERROR, 'ImagePullBackOff: Back-off pulling image "w:1"'),
    ),
    (
        "bad image name",
        pod(
            "Pending",
            conditions=(SCHEDULED,),
            containers=(container({"waiting": {"reason": "InvalidImageName"}}),),
        ),
        PodState(PodStatus.ERROR, "InvalidImageName"),
    ),
    (
        "crash loop after OOM kills",
        pod(
            "Running",
            conditions=(SCHEDULED,),
            containers=(
                container({"waiting": {"reason": "CrashLoopBackOff"}}, restarts=4, last=OOM),
            ),
        ),
        PodState(
            PodStatus.ERROR, "CrashLoopBackOff: last exit OOMKilled (exit code 137), 4 restarts"
        ),
    ),
    (
        "just OOM-killed",
        pod("Running", conditions=(SCHEDULED,), containers=(container(OOM, restarts=1),)),
        PodState(PodStatus.ERROR, "OOMKilled: the worker went over its memory limit"),
    ),
    (
        "running again after one OOM kill",
        pod(
            "Running",
            containers=(container(RUNNING_STATE, ready=True, restarts=1, last=OOM),),
            conditions=(SCHEDULED, cond("Ready", "True")),
        ),
        PodState(PodStatus.RUNNING),
    ),
    (
        "evicted",
        pod("Failed", reason="Evicted", message="The node was low on resource: ephemeral-storage."),
        PodState(PodStatus.EXITED, "Evicted: The node was low on resource: ephemeral-storage."),
    ),
    (
        "node lost (status reason)",
        pod(
            "Running", reason="NodeLost", message="Node gpu-a which was running pod is unresponsive"
        ),
        PodState(PodStatus.EXITED, "node lost: Node gpu-a which was running pod is unresponsive"),
    ),
    (
        "node lost (Ready Unknown)",
        pod(
            "Running",
            conditions=(
                SCHEDULED,
                cond("Ready", "Unknown", "NodeLost", "kubelet stopped posting node status"),
            ),
            containers=(container(RUNNING_STATE, ready=True),),
        ),
        PodState(PodStatus.EXITED, "node lost: kubelet stopped posting node status"),
    ),
    (
        "node not ready",
        pod(
            "Running",
            conditions=(SCHEDULED, cond("Ready", "False", "NodeNotReady")),
            containers=(container(RUNNING_STATE),),
        ),
        PodState(PodStatus.EXITED, "node lost: NodeNotReady"),
    ),
    (
        "deleted by someone else",
        pod(
            "Running",
            deleting=True,
            conditions=(
                SCHEDULED,
                cond("Ready", "True"),
                cond("DisruptionTarget", "True", "EvictionByEvictionAPI"),
            ),
            containers=(container(RUNNING_STATE, ready=True),),
        ),
        PodState(PodStatus.EXITED, "deleted: EvictionByEvictionAPI"),
    ),
    (
        "containers ended",
        pod(
            "Succeeded",
            containers=(container({"terminated": {"exitCode": 0, "reason": "Completed"}}),),
        ),
        PodState(PodStatus.EXITED, "exited: last exit Completed (exit code 0)"),
    ),
    (
        "running, readiness probe not passed yet",
        pod(
            "Running",
            conditions=(
                SCHEDULED,
                cond(
                    "Ready",
                    "False",
                    "ContainersNotReady",
                    "containers with unready status: [worker]",
                ),
            ),
            containers=(container(RUNNING_STATE),),
        ),
        PodState(PodStatus.RUNNING, "not Ready: containers with unready status: [worker]"),
    ),
    (
        "ready",
        pod(
            "Running",
            conditions=(SCHEDULED, cond("Ready", "True")),
            containers=(container(RUNNING_STATE, ready=True),),
        ),
        PodState(PodStatus.RUNNING),
    ),
]


@pytest.mark.parametrize(("what", "obj", "expected"), CASES, ids=[c[0] for c in CASES])
def test_pod_state(what: str, obj: Pod, expected: PodState) -> None:
    assert pod_state(obj) == expected, what


def test_a_reason_is_one_short_line() -> None:
    long = one_line("Unschedulable", "0/300 nodes\n  are available: " + "x" * 1000)
    assert "\n" not in long and len(long) == REASON_CHARS and long.endswith("…")
    assert one_line("a", None, "b") == "a: b"
