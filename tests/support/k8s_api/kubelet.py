"""The kubelet: runs the pods bound to a node as real processes and reports them.

For each bound pod: an address of its own (``status.podIP``, a random 127.x.y.z that
binds), the image pulled if it is one of :attr:`KubeletKnobs.pullable` (else the
container waits ``ErrImagePull``, then ``ImagePullBackOff``, until it becomes
pullable), its first container started through the launcher (no launcher: a
container without a process, running and ready at once), each TCP container port
forwarded to where the process listens, but only for connections the namespace's
NetworkPolicies admit for :attr:`Kubelet.client` (anything else is reset), the
``readinessProbe`` (``httpGet`` HTTP/HTTPS, certificate not verified, as the kubelet
does; ``tcpSocket``) polled into ``Ready``/``ContainersReady`` and the container's
``ready``. A process that exits: ``restartCount`` + 1, ``lastState.terminated``
(exit code, ``Error``/``OOMKilled``/``Completed``), then ``CrashLoopBackOff`` and a
restart (``restartPolicy`` ``Always``; ``Never`` leaves the pod ``Failed``). A
deleted pod's process is stopped (SIGTERM), then the pod is removed. Runs on an
event loop in a thread of its own; status writes go through the :class:`Store`."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import ssl
import tempfile
import threading
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tests.support.k8s_api.container import (
    ConfigError,
    Container,
    ContainerStart,
    Launcher,
    prepare,
)
from tests.support.k8s_api.networkpolicy import Client, admitted
from tests.support.k8s_api.resources import Obj
from tests.support.k8s_api.store import Store, now_iso

T = TypeVar("T")
Key = tuple[str, str, str]
OOM_EXIT = 137
CALL_S = 30.0


@dataclass
class KubeletKnobs:
    pullable: set[str] = field(default_factory=set)
    """Images that pull; ``"*"``: every image."""
    pull_backoff_s: float = 0.2
    """From ``ErrImagePull`` to ``ImagePullBackOff`` (and between later tries)."""
    crash_backoff_s: float = 0.5
    """``CrashLoopBackOff`` before a restart."""
    probe_period_s: float = 0.2
    """Probe period (a pod's ``periodSeconds`` if shorter)."""
    gpu_resource: str = "nvidia.com/gpu"
    """The extended resource that counts GPUs (``worker --gpus N``)."""


class NoProcess:
    """A container without a process (no launcher): runs until killed."""

    def __init__(self) -> None:
        self.code: int | None = None

    @property
    def ports(self) -> dict[int, int]:
        return {}

    def exit_code(self) -> int | None:
        return self.code

    def stop(self) -> None:
        self.code = 0

    def kill(self) -> None:
        self.code = OOM_EXIT


@dataclass
class PodRun:
    key: Key
    ip: str
    node: str
    deleting: asyncio.Event = field(default_factory=asyncio.Event)
    container: Container | None = None
    forwarders: list[asyncio.Server] = field(default_factory=list)
    volumes: tempfile.TemporaryDirectory[str] | None = None
    task: asyncio.Task[None] | None = None
    oom: bool = False
    done: bool = False
    """Lost with its node or evicted: nothing more is reported by this kubelet."""
    refused: list[int] = field(default_factory=list)
    """Ports a connection was refused on (NetworkPolicy)."""


class Kubelet:
    def __init__(
        self,
        store: Store,
        launcher: Launcher | None,
        client: Client,
        knobs: KubeletKnobs,
        freed: Callable[[], None],
    ) -> None:
        self.store, self.launcher, self.client, self.knobs = store, launcher, client, knobs
        self.freed = freed
        self.runs: dict[Key, PodRun] = {}
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="kubelet")
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(CALL_S)

    def close(self) -> None:
        self.call(self._close_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(CALL_S)
        if not self._thread.is_alive():
            self.loop.close()

    async def _close_all(self) -> None:
        for run in list(self.runs.values()):
            run.done = True
            run.deleting.set()
        tasks = [r.task for r in self.runs.values() if r.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- from the API / the cluster (any thread) -----------------------------------------

    def bound(self, key: Key, node: str) -> None:
        """A pod was bound to ``node``: start it."""
        self.loop.call_soon_threadsafe(self._start, key, node)

    def delete(self, key: Key) -> bool:
        """The pod is being deleted: True if this kubelet runs it (and removes it once
        stopped)."""
        run = self.runs.get(key)
        if run is None or run.done:
            return False
        self.loop.call_soon_threadsafe(run.deleting.set)
        return True

    def stop_node(self, node: str) -> list[Key]:
        """The node is lost: its processes are killed and nothing more is reported."""
        return self.call(self._stop_node(node))

    def evict(self, key: Key) -> None:
        self.call(self._evict(key))

    def oom(self, key: Key) -> None:
        self.call(self._oom(key))

    def admitted(self, pod: Obj, port: int) -> bool:
        ns = pod["metadata"].get("namespace", "")
        return admitted(self.store.items("networkpolicies", ns), pod, port, self.client)

    # -- the loop ---------------------------------------------------------------------

    def _start(self, key: Key, node: str) -> None:
        if key in self.runs:
            return
        run = PodRun(key, _new_ip(), node)
        self.runs[key] = run
        run.task = self.loop.create_task(self._lifecycle(run))

    async def _lifecycle(self, run: PodRun) -> None:
        try:
            self._status(run, _created(run))
            if await self._pulled(run):
                await self._containers(run)
        finally:
            await self._release(run)

    async def _pulled(self, run: PodRun) -> bool:
        """Whether the image pulled (False: the pod was deleted first)."""
        reason = "ErrImagePull"
        while not self._pullable(run):
            image = self._pod(run)["spec"]["containers"][0]["image"]
            message = (
                (
                    f'Failed to pull image "{image}": rpc error: code = NotFound desc = failed '
                    f'to pull and unpack image "{image}": not found'
                )
                if reason == "ErrImagePull"
                else f'Back-off pulling image "{image}"'
            )
            self._status(run, _waiting(reason, message))
            reason = "ImagePullBackOff"
            if await _wait(run.deleting, self.knobs.pull_backoff_s):
                return False
        return True

    def _pullable(self, run: PodRun) -> bool:
        pod = self.store.get(run.key)
        if pod is None:
            return False
        image = pod["spec"]["containers"][0]["image"]
        return "*" in self.knobs.pullable or image in self.knobs.pullable

    def _pod(self, run: PodRun) -> Obj:
        pod = self.store.get(run.key)
        if pod is None:
            raise LookupError(f"pod {run.key[1]}/{run.key[2]} is gone")
        return pod

    async def _containers(self, run: PodRun) -> None:
        while not run.deleting.is_set() and not run.done:
            code = await self._once(run)
            if run.deleting.is_set() or run.done or code is None:
                return
            policy = self._pod(run)["spec"].get("restartPolicy", "Always")
            self._status(run, _exited(code, run.oom, policy))
            run.oom = False
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                return
            if await _wait(run.deleting, self.knobs.crash_backoff_s):
                return

    async def _once(self, run: PodRun) -> int | None:
        """Start the container, forward its ports, probe it until it exits (its exit
        code) or the pod is deleted (None)."""
        try:
            start = self._prepare(run)
        except ConfigError as exc:
            self._status(run, _waiting("CreateContainerConfigError", str(exc)))
            await _wait(run.deleting, self.knobs.crash_backoff_s)
            return None if run.deleting.is_set() else await self._once(run)
        try:
            container = await asyncio.to_thread(self._launch, start)
        except Exception:
            return 1
        run.container = container
        await self._forward(run, start, container)
        self._status(run, _running())
        try:
            return await self._probing(run, start, container)
        finally:
            await self._unforward(run)

    def _prepare(self, run: PodRun) -> ContainerStart:
        pod = self._pod(run)
        if run.volumes is None:
            run.volumes = tempfile.TemporaryDirectory(prefix="k8s-pod-")
        ns = run.key[1]
        return prepare(
            pod,
            run.ip,
            Path(run.volumes.name),
            lambda p, n: self.store.get((p, ns, n)),
            self.knobs.gpu_resource,
        )

    def _launch(self, start: ContainerStart) -> Container:
        return NoProcess() if self.launcher is None else self.launcher(start)

    async def _probing(
        self, run: PodRun, start: ContainerStart, container: Container
    ) -> int | None:
        probe = start.container.get("readinessProbe")
        period = self.knobs.probe_period_s
        if probe:
            period = min(period, float(probe.get("periodSeconds", 10)))
        ready: bool | None = None
        failures = 0
        while True:
            code = container.exit_code()
            if code is not None:
                return code
            if run.deleting.is_set() or run.done:
                await asyncio.to_thread(container.stop)
                return None
            ok = (
                True
                if not probe or self.launcher is None
                else await _probe(probe, start, container)
            )
            failures = 0 if ok else failures + 1
            now = ok or (ready is True and failures < int((probe or {}).get("failureThreshold", 3)))
            if now != ready:
                ready = now
                self._status(run, _ready(now))
            await _wait(run.deleting, period)

    # -- ports ------------------------------------------------------------------------

    async def _forward(self, run: PodRun, start: ContainerStart, container: Container) -> None:
        for port in start.container_ports:
            target = container.ports.get(port)

            async def handle(
                reader: asyncio.StreamReader,
                writer: asyncio.StreamWriter,
                port: int = port,
                target: int | None = target,
            ) -> None:
                await self._connection(run, port, target, reader, writer)

            with contextlib.suppress(OSError):
                run.forwarders.append(await asyncio.start_server(handle, run.ip, port))

    async def _connection(
        self,
        run: PodRun,
        port: int,
        target: int | None,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        pod = self.store.get(run.key)
        if pod is None or target is None or not self.admitted(pod, port):
            run.refused.append(port)
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(run.ip, target)
        except OSError:
            writer.transport.abort()
            return
        await asyncio.gather(
            _pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True
        )

    async def _unforward(self, run: PodRun) -> None:
        servers, run.forwarders = run.forwarders, []
        for server in servers:
            server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)

    # -- endings ----------------------------------------------------------------------

    async def _release(self, run: PodRun) -> None:
        await self._unforward(run)
        if run.container is not None and run.container.exit_code() is None:
            await asyncio.to_thread(run.container.kill if run.done else run.container.stop)
        if run.volumes is not None:
            run.volumes.cleanup()
        if run.deleting.is_set() and not run.done:
            self.store.delete(*run.key)
            self.runs.pop(run.key, None)
            self.freed()

    async def _stop_node(self, node: str) -> list[Key]:
        lost = [r for r in self.runs.values() if r.node == node]
        for run in lost:
            run.done = True
            run.deleting.set()
        await asyncio.gather(*(r.task for r in lost if r.task is not None), return_exceptions=True)
        for run in lost:
            self.runs.pop(run.key, None)
        return [r.key for r in lost]

    async def _evict(self, key: Key) -> None:
        run = self.runs[key]
        run.done = True
        run.deleting.set()
        if run.task is not None:
            await asyncio.gather(run.task, return_exceptions=True)
        self._status(run, _evicted(), force=True)
        self.runs.pop(key, None)
        self.freed()

    async def _oom(self, key: Key) -> None:
        run = self.runs[key]
        if run.container is not None:
            run.oom = True
            await asyncio.to_thread(run.container.kill)

    def _status(self, run: PodRun, change: Callable[[Obj], None], *, force: bool = False) -> None:
        """Apply ``change`` to the pod's status (as the kubelet's status manager)."""
        with self.store.lock:
            pod = self.store.get(run.key)
            if pod is None or (run.done and not force):
                return
            before = repr(pod.get("status"))
            status = pod.setdefault("status", {})
            status.setdefault("hostIP", "127.0.0.1")
            status["podIP"], status["podIPs"] = run.ip, [{"ip": run.ip}]
            change(pod)
            if repr(pod["status"]) != before:
                self.store.update("pods", run.key[1], pod)


# -- status changes --------------------------------------------------------------------


def _condition(pod: Obj, kind: str, value: bool, reason: str = "", message: str = "") -> None:
    conditions = pod["status"].setdefault("conditions", [])
    new: Obj = {
        "type": kind,
        "status": "True" if value else "False",
        "lastTransitionTime": now_iso(),
    }
    if reason:
        new["reason"] = reason
    if message:
        new["message"] = message
    for i, old in enumerate(conditions):
        if old["type"] == kind:
            if old["status"] == new["status"] and old.get("reason") == new.get("reason"):
                return
            conditions[i] = new
            return
    conditions.append(new)


def _container_status(pod: Obj) -> Obj:
    c = pod["spec"]["containers"][0]
    statuses = pod["status"].setdefault("containerStatuses", [])
    if not statuses:
        statuses.append(
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {"waiting": {"reason": "ContainerCreating"}},
            }
        )
    found: Obj = statuses[0]
    return found


def _created(run: PodRun) -> Callable[[Obj], None]:
    def change(pod: Obj) -> None:
        pod["status"].setdefault("startTime", now_iso())
        _condition(pod, "PodReadyToStartContainers", True)
        _condition(pod, "Initialized", True)
        _not_ready(pod)
        _container_status(pod)

    return change


def _not_ready(pod: Obj) -> None:
    names = [c["name"] for c in pod["spec"]["containers"]]
    message = f"containers with unready status: [{' '.join(names)}]"
    _condition(pod, "Ready", False, "ContainersNotReady", message)
    _condition(pod, "ContainersReady", False, "ContainersNotReady", message)


def _waiting(reason: str, message: str) -> Callable[[Obj], None]:
    def change(pod: Obj) -> None:
        cs = _container_status(pod)
        cs["state"] = {"waiting": {"reason": reason, "message": message}}
        cs["ready"], cs["started"] = False, False
        _not_ready(pod)

    return change


def _running() -> Callable[[Obj], None]:
    def change(pod: Obj) -> None:
        cs = _container_status(pod)
        cs["state"] = {"running": {"startedAt": now_iso()}}
        cs["started"], cs["ready"] = True, False
        cs["imageID"] = f"{cs['image']}@sha256:{'0' * 64}"
        cs["containerID"] = f"containerd://{uuid.uuid4().hex}"
        pod["status"]["phase"] = "Running"
        _not_ready(pod)

    return change


def _ready(ready: bool) -> Callable[[Obj], None]:
    def change(pod: Obj) -> None:
        cs = _container_status(pod)
        cs["ready"] = ready
        if ready:
            _condition(pod, "Ready", True)
            _condition(pod, "ContainersReady", True)
        else:
            _not_ready(pod)

    return change


def _exited(code: int, oom: bool, policy: str) -> Callable[[Obj], None]:
    def change(pod: Obj) -> None:
        cs = _container_status(pod)
        started = cs["state"].get("running", {}).get("startedAt", now_iso())
        reason = "OOMKilled" if oom else ("Completed" if code == 0 else "Error")
        terminated = {
            "exitCode": code,
            "reason": reason,
            "startedAt": started,
            "finishedAt": now_iso(),
            "containerID": cs.get("containerID", ""),
        }
        cs["ready"], cs["started"] = False, False
        _not_ready(pod)
        if policy == "Never" or (policy == "OnFailure" and code == 0):
            cs["state"] = {"terminated": terminated}
            pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
            return
        cs["lastState"] = {"terminated": terminated}
        cs["restartCount"] += 1
        meta = pod["metadata"]
        message = (
            f"back-off 10s restarting failed container={cs['name']} "
            f"pod={meta['name']}_{meta.get('namespace', '')}({meta['uid']})"
        )
        cs["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": message}}

    return change


def _evicted() -> Callable[[Obj], None]:
    def change(pod: Obj) -> None:
        cs = _container_status(pod)
        name = cs["name"]
        pod["status"]["phase"] = "Failed"
        pod["status"]["reason"] = "Evicted"
        pod["status"]["message"] = (
            f"The node was low on resource: memory. Threshold quantity: 100Mi, "
            f"available: 51200Ki. Container {name} was using 2Gi, request is 1Gi, "
            "has larger consumption of memory. "
        )
        cs["state"] = {
            "terminated": {"exitCode": OOM_EXIT, "reason": "Error", "finishedAt": now_iso()}
        }
        cs["ready"], cs["started"] = False, False
        _not_ready(pod)
        _condition(
            pod,
            "DisruptionTarget",
            True,
            "TerminationByKubelet",
            "The node was low on resource: memory. ",
        )

    return change


# -- helpers ---------------------------------------------------------------------------


async def _wait(event: asyncio.Event, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``event``; whether it is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
    return event.is_set()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _probe(probe: Obj, start: ContainerStart, container: Container) -> bool:
    """One readiness probe against the process itself (kubelet probes are not network
    policy traffic)."""
    timeout = float(probe.get("timeoutSeconds", 1))
    if "httpGet" in probe:
        get = probe["httpGet"]
        port = container.ports.get(_port_number(get["port"], start.container))
        if port is None:
            return False
        scheme = get.get("scheme", "HTTP").lower()
        url = f"{scheme}://{start.ip}:{port}{get.get('path', '/')}"
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        try:
            async with httpx.AsyncClient(verify=context, timeout=timeout) as client:
                resp = await client.get(url)
        except httpx.HTTPError:
            return False
        return 200 <= resp.status_code < 400
    if "tcpSocket" in probe:
        port = container.ports.get(_port_number(probe["tcpSocket"]["port"], start.container))
        if port is None:
            return False
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(start.ip, port), timeout)
        except (OSError, TimeoutError):
            return False
        writer.close()
        return True
    return True


def _port_number(port: int | str, container: Obj) -> int:
    if isinstance(port, int):
        return port
    for p in container.get("ports", []):
        if p.get("name") == port:
            return int(p["containerPort"])
    return int(port) if str(port).isdigit() else -1


def _new_ip() -> str:
    """A random loopback address that binds (the pod's own)."""
    rng = random.SystemRandom()
    for _ in range(100):
        ip = f"127.{rng.randint(10, 250)}.{rng.randint(0, 255)}.{rng.randint(2, 254)}"
        with socket.socket() as s:
            try:
                s.bind((ip, 0))
            except OSError:
                continue
        return ip
    raise RuntimeError("no bindable loopback address for a pod")
