"""The ``local`` provider: GPU workers as ``framerelay worker`` child processes.

Used by the demo, the tests and the fault suite. A pod is one
:class:`framerelay.launcher.LocalWorker`: one worker process, or for a pod of
``gpu_count`` > 1 ``framerelay worker --gpus N`` and its one worker per "GPU"
(on a machine without GPUs they run on the CPU); it is PROVISIONING while the process
warms up, RUNNING once it announced its URL, EXITED when the process died
(``kill -9`` in the fault tests). Pod ids are the pod names.

A worker gets its environment explicitly (the launcher passes no copy of
this process's). With TLS on, its certificate and key are written to a
private folder (0700, files 0600) and passed by path; the folder goes with
the pod. A tier's ``volume.local_dir`` is the pods' shared "network volume": their
workers keep their artefact cache there (``<dir>/framerelay/cache``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from pydantic import SecretStr

from deploy.models import Endpoint, PodInfo, PodSpec, PodStatus
from deploy.providers.base import GpuPrice, ProviderError
from deploy.settings import LocalSettings
from framerelay.errors import ConfigError
from framerelay.launcher import LocalWorker

log = logging.getLogger(__name__)
LOCAL_GPU = "local-cpu"
_CERT_PEM, _KEY_PEM = "FRAMERELAY_WORKER_TLS_CERT_PEM", "FRAMERELAY_WORKER_TLS_KEY_PEM"
_SECRETS = "FRAMERELAY_TOKEN_SECRETS"


class _Pod:
    def __init__(self, spec: PodSpec, worker: LocalWorker, tls_dir: Path | None) -> None:
        self.spec = spec
        self.worker = worker
        self.tls_dir = tls_dir
        self.ready = threading.Event()
        self.failed: str | None = None
        self.terminated = False


def write_tls_files(cert: SecretStr, key: SecretStr, name: str) -> tuple[Path, dict[str, str]]:
    """The PEMs in a new private folder; (folder, the worker's env naming the files)."""
    folder = Path(tempfile.mkdtemp(prefix=f"framerelay-{name}-tls-"))  # 0700
    paths = {}
    for env, fname, value in (("TLS_CERT", "cert.pem", cert), ("TLS_KEY", "key.pem", key)):
        path = folder / fname
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(value.get_secret_value())
        paths[f"FRAMERELAY_WORKER_{env}"] = str(path)
    return folder, paths


class LocalProvider:
    name = "local"

    def __init__(
        self,
        settings: LocalSettings,
        *,
        env_hook: Callable[[PodSpec], dict[str, str]] | None = None,
    ) -> None:
        """``env_hook`` (tests only) adds environment to chosen pods, e.g. a fault."""
        self.settings = settings
        self._env_hook = env_hook
        self.pods: dict[str, _Pod] = {}

    def cert_names(self, name: str) -> tuple[list[str], list[str]]:
        """Extra names in a local pod's certificate: it listens on 127.0.0.1."""
        return [], ["127.0.0.1"]

    async def create(self, spec: PodSpec) -> PodInfo:
        if spec.name in self.pods and not self.pods[spec.name].terminated:
            raise ProviderError(f"local pod {spec.name!r} already exists")
        secrets = dict(spec.secret_env)
        hs256 = secrets.pop(_SECRETS, None)
        volume = self.settings.volume_for(spec.tier)
        shared = volume.worker_env(volume.local_dir) if volume and volume.local_dir else {}
        env = {**shared, **spec.env, **(self._env_hook(spec) if self._env_hook else {})}
        env["FRAMERELAY_WORKER_HOST"] = "127.0.0.1"  # local processes: loopback only
        cert, key = secrets.pop(_CERT_PEM, None), secrets.pop(_KEY_PEM, None)
        tls_dir = None
        if cert is not None and key is not None:
            tls_dir, paths = write_tls_files(cert, key, spec.name)
            env.update(paths)
        env.update({k: v.get_secret_value() for k, v in secrets.items()})
        args = ["--model", str(self.settings.model), "--threads", str(self.settings.threads)]
        worker = LocalWorker(
            hs256.get_secret_value() if hs256 is not None else None,
            worker_id=spec.name, args=args, env=env, gpus=spec.gpu_count,
        )  # fmt: skip
        pod = _Pod(spec, worker, tls_dir)
        self.pods[spec.name] = pod
        threading.Thread(target=self._start, args=(pod,), daemon=True).start()
        return self._info(pod)

    def _start(self, pod: _Pod) -> None:
        try:
            pod.worker.start(self.settings.ready_timeout_s)
            pod.ready.set()
        except ConfigError as exc:
            pod.failed = str(exc)[:300]
            log.warning("local pod %s failed to start: %s", pod.spec.name, pod.failed)

    def _price(self, spec: PodSpec) -> float:
        return self.settings.spot_price_per_hr if spec.spot else self.settings.price_per_hr

    def _info(self, pod: _Pod) -> PodInfo:
        proc = pod.worker.proc
        if pod.terminated:
            status = PodStatus.TERMINATED
        elif pod.failed or (proc is not None and proc.poll() is not None):
            status = PodStatus.EXITED
        elif pod.ready.is_set():
            status = PodStatus.RUNNING
        else:
            status = PodStatus.PROVISIONING
        info = PodInfo(
            id=pod.spec.name,
            name=pod.spec.name,
            status=status,
            cost_per_hr=self._price(pod.spec),
            gpu_type=LOCAL_GPU,
            spot=pod.spec.spot,
            cloud_type="LOCAL",
        )
        if status is PodStatus.RUNNING:
            urls = pod.worker.urls
            info.set_endpoints(tuple(
                Endpoint(url, "http" + url.removeprefix("ws").removesuffix("/v1/tunnel"))
                for url in urls
            ))  # fmt: skip
            if urls[0].startswith("wss://"):
                info.tls_server_name = pod.spec.tls_server_name
        return info

    async def get(self, pod_id: str) -> PodInfo | None:
        pod = self.pods.get(pod_id)
        return None if pod is None or pod.terminated else self._info(pod)

    async def list(self) -> list[PodInfo]:
        return [self._info(p) for p in self.pods.values() if not p.terminated]

    async def stop(self, pod_id: str) -> None:
        await self.terminate(pod_id)

    async def terminate(self, pod_id: str) -> None:
        pod = self.pods.get(pod_id)
        if pod is None or pod.terminated:
            return
        pod.terminated = True
        await asyncio.to_thread(pod.worker.stop, 5.0)
        if pod.tls_dir is not None:
            shutil.rmtree(pod.tls_dir, ignore_errors=True)

    async def prices(self) -> dict[str, GpuPrice]:
        od, spot = self.settings.price_per_hr, self.settings.spot_price_per_hr
        return {LOCAL_GPU: GpuPrice(LOCAL_GPU, od, od, spot, spot)}

    def kill(self, pod_id: str) -> None:
        """SIGKILL a pod's process (fault tests): it shows as EXITED."""
        self.pods[pod_id].worker.kill()

    async def aclose(self) -> None:
        for name in list(self.pods):
            with contextlib.suppress(OSError):
                await self.terminate(name)
