"""The test-facing contract Kubernetes API server: state, knobs, HTTP in a thread.

::

    with K8sContractServer(nodes=[NodeSpec("gpu-a", taints=(GPU_TAINT,),
                           allocatable={"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"})],
                           pullable={"framerelay/worker:0.1.0"}) as k8s:
        k8s.write_kubeconfig(tmp_path / "kubeconfig")   # server URL + bearer token
        ...
        assert k8s.violations() == []
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

import yaml  # type: ignore[import-untyped]

from bench.rig.serving import serve_in_thread
from tests.support.k8s_api.app import create_app
from tests.support.k8s_api.cluster import Cluster, Stage
from tests.support.k8s_api.container import Launcher
from tests.support.k8s_api.kubelet import Kubelet, KubeletKnobs
from tests.support.k8s_api.networkpolicy import Client
from tests.support.k8s_api.resources import BY_KIND, Obj
from tests.support.k8s_api.rest import Hooks, Rest
from tests.support.k8s_api.scheduler import NodeSpec
from tests.support.k8s_api.store import Store

DEFAULT_VERSION = "1.32.0"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
"""The taint GPU node pools carry on GKE, AKS, EKS and most on-prem installs."""


class K8sContractServer:
    def __init__(
        self,
        *,
        nodes: Iterable[NodeSpec] = (),
        version: str = DEFAULT_VERSION,
        pullable: Iterable[str] = ("*",),
        launcher: Launcher | None = None,
        namespaces: Iterable[str] = ("default", "framerelay"),
        client: Client | None = None,
        extended_resource_toleration: bool = False,
        token: str | None = None,
        rules: Iterable[Obj] | None = None,
    ) -> None:
        """``launcher``: runs each pod's container (``worker_launcher(model)`` for
        ``framerelay worker``); None: containers without a process, running and
        ready at once. ``client``: who connects to pods' ports (NetworkPolicy).
        ``rules``: the RBAC rules of the token (e.g. the orchestrator's Role in
        deploy/k8s, :func:`tests.support.k8s_api.rbac.role_rules`); None: all allowed."""
        self.token = token or "k8s-" + secrets.token_urlsafe(24)
        self.version = version
        self.store = Store()
        self.knobs = KubeletKnobs(pullable=set(pullable))
        self.client = client or Client()
        self.kubelet = Kubelet(self.store, launcher, self.client, self.knobs, self._freed)
        self.cluster = Cluster(self.store, self.kubelet)
        self.rest = Rest(
            self.store,
            version,
            self.token,
            set(namespaces),
            extended_resource_toleration=extended_resource_toleration,
            hooks=Hooks(changed=self.cluster.schedule, delete_pod=self._delete_pod),
            rules=None if rules is None else list(rules),
        )
        for node in nodes:
            self.cluster.add_node(node)
        self.url = ""
        self._stack = contextlib.ExitStack()

    # -- lifetime ---------------------------------------------------------------------

    def __enter__(self) -> K8sContractServer:
        port = self._stack.enter_context(
            serve_in_thread(create_app(self.rest), "Kubernetes contract server")
        )
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.store.closing = True
        try:
            self.kubelet.close()
        finally:
            self._stack.close()

    def kubeconfig(self, namespace: str = "framerelay") -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "contract", "cluster": {"server": self.url}}],
            "users": [{"name": "contract", "user": {"token": self.token}}],
            "contexts": [
                {
                    "name": "contract",
                    "context": {"cluster": "contract", "user": "contract", "namespace": namespace},
                }
            ],
            "current-context": "contract",
        }

    def write_kubeconfig(self, path: Path, namespace: str = "framerelay") -> Path:
        """A kubeconfig (server URL, bearer token, namespace), mode 0600."""
        path.write_text(yaml.safe_dump(self.kubeconfig(namespace)), encoding="utf-8")
        path.chmod(0o600)
        return path

    # -- what a test reads --------------------------------------------------------------

    def objects(self, kind: str, namespace: str | None = None) -> list[Obj]:
        """Every stored object of a kind (``"Pod"``, ``"Secret"``, ...)."""
        resource = BY_KIND[kind]
        return [
            {"apiVersion": resource.api_version, "kind": kind, **o}
            for o in self.store.items(resource.plural, namespace)
        ]

    def pod(self, name: str, namespace: str = "framerelay") -> Obj | None:
        return self.store.get(("pods", namespace, name))

    def violations(self) -> list[str]:
        """Objects received that broke the schema or carried a private key outside a
        Secret's data (``client: ...``), and objects this server sent that broke the
        schema (``server: ...``, its own bugs). Empty at the end of every test."""
        return list(self.rest.violations)

    def take_violations(self) -> list[str]:
        """:meth:`violations`, forgotten (a test that provokes them on purpose)."""
        with self.store.lock:
            found = list(self.rest.violations)
            self.rest.violations.clear()
        return found

    @property
    def client_errors(self) -> list[str]:
        """Requests for what the API does not have here (an undeclared query parameter,
        an unknown path, a patch type not played)."""
        return list(self.rest.client_errors)

    @property
    def creates(self) -> dict[str, int]:
        """How many times each pod (``namespace/name``) was created."""
        return dict(self.store.creates)

    def admitted(self, pod: str, port: int, namespace: str = "framerelay") -> bool:
        """Whether the NetworkPolicies let :attr:`client` reach ``port`` of the pod."""
        obj = self.pod(pod, namespace)
        if obj is None:
            raise KeyError(f"no pod {namespace}/{pod}")
        return self.kubelet.admitted({"kind": "Pod", **obj}, port)

    # -- knobs --------------------------------------------------------------------------

    def add_node(self, node: NodeSpec) -> None:
        self.cluster.add_node(node)

    def lose_node(self, name: str, stage: Stage = "gone") -> None:
        """The node is lost (a spot VM reclaimed): see :mod:`cluster` for the stages."""
        self.cluster.lose_node(name, stage)

    def evict(self, pod: str, namespace: str = "framerelay") -> None:
        """The kubelet evicts the pod (node memory pressure): ``Failed``, ``Evicted``."""
        self.kubelet.evict(("pods", namespace, pod))
        self.cluster.schedule()

    def oom(self, pod: str, namespace: str = "framerelay") -> None:
        """The container is killed for memory: ``OOMKilled``, then restarted."""
        self.kubelet.oom(("pods", namespace, pod))

    def compact(self) -> int:
        """Drop the watch history: a watch from an older version gets 410 Expired."""
        return self.store.compact()

    def drop_watches(self) -> None:
        """End every open watch stream (the client resumes from its last version)."""
        self.store.drop_watches()

    def expire_watches(self, node: NodeSpec) -> None:
        """Add ``node`` (the history moves on, past every pod watch's last event), drop the
        history and end every watch, in one step: no bookmark or event can reach a watcher
        in between, so each resumes from a version the server no longer holds (410)."""
        with self.store.lock:
            self.cluster.add_node(node)
            self.store.compact()
            self.store.drop_watches()

    @property
    def open_watches(self) -> int:
        """Watch streams open now (0 once :meth:`drop_watches` took effect)."""
        return self.store.watching

    def set_pullable(self, images: Iterable[str]) -> None:
        self.knobs.pullable = set(images)

    # -- hooks --------------------------------------------------------------------------

    def _delete_pod(self, pod: Obj) -> bool:
        return self.kubelet.delete(("pods", pod["metadata"]["namespace"], pod["metadata"]["name"]))

    def _freed(self) -> None:
        self.cluster.schedule()
