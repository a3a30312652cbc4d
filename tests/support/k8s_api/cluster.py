"""The control plane's controllers around the API: the scheduler binding pending pods
(or marking them ``Unschedulable`` with its message, tried again whenever something
changed) and the node lifecycle when a node is lost.

A lost node, as Kubernetes handles one (kubelet gone, the node controller after its
grace period, the taint eviction controller, then the pod garbage collector once the
cloud deleted the node object): the node's ``Ready`` becomes ``Unknown``
(``NodeStatusUnknown``) and it gets the ``node.kubernetes.io/unreachable`` taints;
its pods' ``Ready`` condition becomes ``False``; then (stage ``terminating``) each pod
gets ``DisruptionTarget`` (``DeletionByTaintManager``) and a ``deletionTimestamp`` and
stays ``Terminating``, its kubelet being unreachable; then (stage ``gone``, the
default) the node object is deleted and its pods are removed (``DELETED``)."""

from __future__ import annotations

from collections import Counter
from typing import Literal

from tests.support.k8s_api.kubelet import Kubelet
from tests.support.k8s_api.resources import Obj
from tests.support.k8s_api.scheduler import (
    NodeSpec,
    choose,
    node_object,
    pod_requests,
    ready_condition,
)
from tests.support.k8s_api.store import Store, now_iso

Stage = Literal["not-ready", "terminating", "gone"]
UNREACHABLE = "node.kubernetes.io/unreachable"


class Cluster:
    def __init__(self, store: Store, kubelet: Kubelet) -> None:
        self.store, self.kubelet = store, kubelet
        self._node_count = 0

    def add_node(self, node: NodeSpec) -> None:
        from tests.support.k8s_api.resources import BY_KIND

        self._node_count += 1
        obj = node_object(node, f"127.0.1.{self._node_count}")
        self.store.create(BY_KIND["Node"], "", obj)
        self.schedule()

    def used(self) -> dict[str, dict[str, float]]:
        out: dict[str, Counter[str]] = {}
        for pod in self.store.items("pods"):
            node = pod["spec"].get("nodeName")
            if node and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                total = out.setdefault(node, Counter())
                total.update(pod_requests(pod["spec"]))
                total["pods"] += 1
        return {n: dict(c) for n, c in out.items()}

    def schedule(self) -> None:
        """Bind each pending pod that fits a node; mark the others Unschedulable."""
        with self.store.lock:
            for pod in self.store.items("pods"):
                if pod["spec"].get("nodeName") or "deletionTimestamp" in pod["metadata"]:
                    continue
                if pod["spec"].get("schedulerName", "default-scheduler") != "default-scheduler":
                    continue
                nodes = self.store.items("nodes")
                node, message = choose(pod["spec"], nodes, self.used())
                if node is None:
                    self._unschedulable(pod, message)
                else:
                    self._bind(pod, node)

    def _unschedulable(self, pod: Obj, message: str) -> None:
        status = pod.setdefault("status", {"phase": "Pending"})
        conditions = status.setdefault("conditions", [])
        old = next((c for c in conditions if c["type"] == "PodScheduled"), None)
        if old is not None and old.get("message") == message:
            return
        new = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": now_iso(),
        }
        status["conditions"] = [c for c in conditions if c["type"] != "PodScheduled"] + [new]
        self.store.update("pods", pod["metadata"]["namespace"], pod)

    def _bind(self, pod: Obj, node: str) -> None:
        pod["spec"]["nodeName"] = node
        status = pod.setdefault("status", {"phase": "Pending"})
        conditions = [c for c in status.get("conditions", []) if c["type"] != "PodScheduled"]
        status["conditions"] = [
            *conditions,
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now_iso()},
        ]
        ns = pod["metadata"]["namespace"]
        self.store.update("pods", ns, pod)
        self.kubelet.bound(("pods", ns, pod["metadata"]["name"]), node)

    def lose_node(self, name: str, stage: Stage = "gone") -> None:
        keys = self.kubelet.stop_node(name)
        with self.store.lock:
            self._node_unknown(name)
            for key in keys:
                self._pod_change(key, _pod_not_ready)
            if stage == "not-ready":
                return
            for key in keys:
                self._pod_change(key, _taint_evicted)
            if stage == "gone":
                self.store.delete("nodes", "", name)
                for key in keys:
                    self.store.delete(*key)
        self.schedule()

    def _node_unknown(self, name: str) -> None:
        node = self.store.get(("nodes", "", name))
        if node is None:
            raise KeyError(f"no node {name}")
        node["status"]["conditions"] = [
            ready_condition("Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")
        ]
        taints = node["spec"].setdefault("taints", [])
        for effect in ("NoSchedule", "NoExecute"):
            taint = {"key": UNREACHABLE, "effect": effect}
            if effect == "NoExecute":
                taint["timeAdded"] = now_iso()
            taints.append(taint)
        self.store.update("nodes", "", node)

    def _pod_change(self, key: tuple[str, str, str], change: object) -> None:
        pod = self.store.get(key)
        if pod is not None:
            change(pod)  # type: ignore[operator]
            self.store.update("pods", key[1], pod)


def _pod_not_ready(pod: Obj) -> None:
    for c in pod.get("status", {}).get("conditions", []):
        if c["type"] == "Ready":
            c["status"], c["lastTransitionTime"] = "False", now_iso()
            c.pop("reason", None)
            c.pop("message", None)


def _taint_evicted(pod: Obj) -> None:
    pod["metadata"]["deletionTimestamp"] = now_iso()
    pod["metadata"]["deletionGracePeriodSeconds"] = int(
        pod["spec"].get("terminationGracePeriodSeconds", 30)
    )
    pod["status"].setdefault("conditions", []).append(
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "DeletionByTaintManager",
            "message": "Taint manager: deleting due to NoExecute taint",
            "lastTransitionTime": now_iso(),
        }
    )
