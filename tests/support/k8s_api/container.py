"""A pod's container as a real process: what the kubelet hands a launcher, and the
default launcher, ``framerelay worker`` (the image's entrypoint) with the pod's args.

The kubelet resolves the container's environment (``value``, ``secretKeyRef``,
``configMapKeyRef``, ``fieldRef``), writes its Secret, ConfigMap and emptyDir volumes
to a directory of their own and rewrites every path under a volume's ``mountPath``
(in the environment and the args) to it. The process listens on the pod's own
loopback address (``status.podIP``) on ports of its choosing; the launcher says which
container port each one stands for, and the kubelet forwards that port to it."""

from __future__ import annotations

import base64
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from framerelay.launcher import LocalWorker
from tests.support.k8s_api.resources import Obj
from tests.support.k8s_api.scheduler import pod_requests


@dataclass(frozen=True)
class ContainerStart:
    """One container to run."""

    pod: Obj
    container: Obj
    ip: str
    """The pod's address: listen here."""
    args: list[str]
    """``command`` + ``args``, volume paths rewritten."""
    env: dict[str, str]
    """Resolved, volume paths rewritten."""
    volumes: Path
    gpu_resource: str

    @property
    def gpus(self) -> int:
        requests = pod_requests(self.pod["spec"])
        return max(1, int(requests.get(self.gpu_resource, 0)))

    @property
    def container_ports(self) -> list[int]:
        return sorted(
            p["containerPort"]
            for p in self.container.get("ports", [])
            if p.get("protocol", "TCP") == "TCP"
        )


class Container(Protocol):
    """A running container's process."""

    @property
    def ports(self) -> dict[int, int]:
        """Container port -> the port on the pod's address where the process listens."""

    def exit_code(self) -> int | None:
        """None while it runs."""

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace."""

    def kill(self) -> None:
        """SIGKILL at once."""


Launcher = Callable[[ContainerStart], Container]
"""Starts a container and returns once it runs (a readiness probe decides when it is
ready); an exception is a container that exited at once (exit code 1)."""


class WorkerContainer:
    """``framerelay worker`` from a :class:`ContainerStart`: a :class:`LocalWorker`."""

    def __init__(self, start: ContainerStart, model: Path, timeout_s: float) -> None:
        env = dict(start.env)
        for name in ("FRAMERELAY_WORKER_HOST", "FRAMERELAY_WORKER_PORT"):
            env.pop(name, None)
        args = list(start.args)
        if args[:1] == ["framerelay"]:
            args = args[1:]
        if args[:1] != ["worker"]:
            raise ValueError(f"the worker image runs 'framerelay worker', not {shlex.join(args)!r}")
        gpus, rest = _without_gpus(args[1:])
        self.worker = LocalWorker(
            None,
            worker_id=env.pop("FRAMERELAY_WORKER_WORKER_ID", start.pod["metadata"]["name"]),
            env=env,
            gpus=gpus or start.gpus,
            args=[
                *_without(rest, ("--host", "--port")),
                "--model",
                str(model),
                "--threads",
                "1",
                "--host",
                start.ip,
            ],
            remove_log=True,
        )
        self.worker.start(timeout_s)
        listening = [int(url.rsplit(":", 1)[1].split("/")[0]) for url in self.worker.urls]
        self._ports = dict(zip(start.container_ports, listening, strict=False))

    @property
    def ports(self) -> dict[int, int]:
        return dict(self._ports)

    def exit_code(self) -> int | None:
        proc = self.worker.proc
        return None if proc is None else proc.poll()

    def stop(self) -> None:
        self.worker.stop()

    def kill(self) -> None:
        self.worker.kill()
        self.worker.stop()


def worker_launcher(model: Path, timeout_s: float = 120.0) -> Launcher:
    """The default launcher: ``framerelay worker`` with the pod's args (``--gpus N``
    from them or from the pod's GPU request), ``--model`` this CPU model, one thread."""
    return lambda start: WorkerContainer(start, model, timeout_s)


def _without_gpus(args: list[str]) -> tuple[int, list[str]]:
    if "--gpus" in args:
        i = args.index("--gpus")
        return int(args[i + 1]), args[:i] + args[i + 2 :]
    return 0, args


def _without(args: list[str], options: tuple[str, ...]) -> list[str]:
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in options:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in options)):
            out.append(arg)
    return out


class ConfigError(Exception):
    """The container cannot be made from what the API holds (``CreateContainerConfigError``)."""


Lookup = Callable[[str, str], Obj | None]
"""(plural, name) -> the object of the pod's namespace, or None."""


def prepare(pod: Obj, ip: str, volumes: Path, lookup: Lookup, gpu_resource: str) -> ContainerStart:
    """The pod's first container, ready to start: volumes written under ``volumes``,
    env resolved, paths under each mount rewritten."""
    container = pod["spec"]["containers"][0]
    mounts = _write_volumes(pod, container, volumes, lookup)
    env = {
        e["name"]: _rewrite(_env_value(e, pod, ip, lookup), mounts)
        for e in container.get("env", [])
    }
    args = [
        _rewrite(a, mounts) for a in [*container.get("command", []), *container.get("args", [])]
    ]
    return ContainerStart(pod, container, ip, args, env, volumes, gpu_resource)


def _env_value(entry: Obj, pod: Obj, ip: str, lookup: Lookup) -> str:
    if "value" in entry:
        return str(entry["value"])
    source = entry.get("valueFrom") or {}
    for kind, plural in (("secretKeyRef", "secrets"), ("configMapKeyRef", "configmaps")):
        if kind in source:
            ref = source[kind]
            obj = lookup(plural, ref["name"])
            data = _data(obj, plural) if obj is not None else {}
            if ref["key"] in data:
                return data[ref["key"]]
            if ref.get("optional"):
                return ""
            what = "secret" if plural == "secrets" else "configmap"
            if obj is None:
                raise ConfigError(f'{what} "{ref["name"]}" not found')
            where = f"{pod['metadata'].get('namespace')}/{ref['name']}"
            raise ConfigError(f"couldn't find key {ref['key']} in {what.capitalize()} {where}")
    if "fieldRef" in source:
        fields = {
            "metadata.name": pod["metadata"]["name"],
            "metadata.namespace": pod["metadata"].get("namespace", ""),
            "status.podIP": ip,
            "spec.nodeName": pod["spec"].get("nodeName", ""),
        }
        return str(fields.get(source["fieldRef"]["fieldPath"], ""))
    return ""


def _data(obj: Obj, plural: str) -> dict[str, str]:
    if plural == "secrets":
        return {
            k: base64.b64decode(v).decode("utf-8", "replace")
            for k, v in (obj.get("data") or {}).items()
        }
    return dict(obj.get("data") or {})


def _write_volumes(pod: Obj, container: Obj, root: Path, lookup: Lookup) -> dict[str, Path]:
    """mountPath -> the directory standing for it."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    out: dict[str, Path] = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"], {})
        where = root / mount["name"]
        where.mkdir(parents=True, exist_ok=True)
        for kind, plural, key in (
            ("secret", "secrets", "secretName"),
            ("configMap", "configmaps", "name"),
        ):
            if kind in volume:
                obj = lookup(plural, volume[kind][key])
                if obj is None:
                    raise ConfigError(f'{kind} "{volume[kind][key]}" not found')
                data = _data(obj, plural)
                items = volume[kind].get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    target = where / item["path"]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(data[item["key"]], encoding="utf-8")
                    target.chmod(0o600)
        out[mount["mountPath"].rstrip("/")] = where
    return out


def _rewrite(value: str, mounts: dict[str, Path]) -> str:
    for mount_path in sorted(mounts, key=len, reverse=True):
        if value == mount_path or value.startswith(mount_path + "/"):
            return str(mounts[mount_path]) + value[len(mount_path) :]
    return value
