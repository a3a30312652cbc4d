"""A contract Kubernetes API server for the tests (issue 31): the documented REST API
(server-side apply, get, list, watch with ``resourceVersion`` and 410, delete) on
127.0.0.1, every object validated against the Kubernetes OpenAPI schemas
(kubernetes-validate, strict), a scheduler (taints, tolerations, selectors, node
affinity, resources), a kubelet running pods as real processes on their own loopback
addresses behind the namespace's NetworkPolicies, and failure knobs (a node lost, an
eviction, an OOM kill, a compacted watch history, dropped watches).

Modules: ``resources`` (REST resources, Status errors), ``store`` (objects, versions,
history), ``selectors``, ``validation``, ``admission`` (defaults, pod immutability),
``apply`` (server-side apply, merge patch), ``rest`` (the verbs), ``app`` (HTTP,
watch streams), ``scheduler``, ``networkpolicy``, ``container`` (what a launcher
gets, ``framerelay worker``), ``kubelet``, ``cluster`` (scheduler loop, node
lifecycle), ``server`` (:class:`K8sContractServer`). Imports ``framerelay.launcher``
and ``bench.rig.serving`` only beside the standard library and its test deps."""

from tests.support.k8s_api.container import ContainerStart, Launcher, worker_launcher
from tests.support.k8s_api.networkpolicy import Client
from tests.support.k8s_api.scheduler import NodeSpec
from tests.support.k8s_api.server import GPU_TAINT, K8sContractServer

__all__ = [
    "GPU_TAINT",
    "Client",
    "ContainerStart",
    "K8sContractServer",
    "Launcher",
    "NodeSpec",
    "worker_launcher",
]
