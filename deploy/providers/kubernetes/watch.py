"""A local cache of the pods the orchestrator owns, kept current by one LIST and then a
WATCH, so that the provider reads pods from memory instead of asking every tick.

The usual informer loop, as Kubernetes documents it for its API ("Efficient detection
of changes"):

* list the pods with the orchestrator's label selector; the list's ``resourceVersion``
  is where the watch starts;
* apply each event (``ADDED``/``MODIFIED``: the pod as it is now; ``DELETED``: gone),
  remembering the last ``resourceVersion`` seen;
* a dropped connection (or the server ending the watch) resumes the watch from that
  version, so no event is missed and none is taken twice;
* ``410 Gone`` (``Expired``: the server no longer holds history that far back) means
  the cache may have missed events: list again and start over from the new version.

Failed attempts wait a bounded, growing delay (:class:`~framerelay.backoff.Backoff`);
the task is cancelled by :meth:`PodWatch.aclose`. A pod the provider just created is
kept (:meth:`PodWatch.created`) until a list or an event shows it, so a re-list taken
a moment before the create does not make it look gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

from lightkube.resources.core_v1 import Pod

from deploy.providers.kubernetes.client import KubeApi, is_gone
from framerelay.backoff import Backoff

log = logging.getLogger(__name__)
RETRY_FIRST_S = 0.2
RETRY_MAX_S = 10.0
SETTLE_S = 2.0
"""A watch resumed after a failure that has stayed open this long, with no event yet,
counts as working again."""


def pod_name(pod: Pod) -> str:
    return str(pod.metadata.name) if pod.metadata is not None else ""


class PodWatch:
    """The orchestrator's pods by name, as the API server last said."""

    def __init__(
        self,
        api: KubeApi,
        labels: Mapping[str, str],
        *,
        on_deleted: Callable[[str], None] | None = None,
    ) -> None:
        self.api = api
        self.labels = dict(labels)
        self.pods: dict[str, Pod] = {}
        self.resource_version: str | None = None
        self.synced = asyncio.Event()
        """Set once the first list is in."""
        self.failing: str | None = None
        """Why the last attempt to list or watch failed; None again after a list or an
        event (see :attr:`broken`)."""
        self.lists = 0
        """Lists so far: 1 + one per ``410 Gone``."""
        self.resumes = 0
        """Watches resumed from a known resourceVersion after a break."""
        self._on_deleted = on_deleted
        self._fresh: dict[str, Pod] = {}
        self._task: asyncio.Task[None] | None = None
        self._open_since: float | None = None

    @property
    def broken(self) -> str | None:
        """Why the cache may be out of date now (None: the watch works, as far as is
        known): the last failure, until a list, an event, or a watch open for
        :data:`SETTLE_S` since."""
        if self.failing is None:
            return None
        opened = self._open_since
        if opened is not None and asyncio.get_running_loop().time() - opened >= SETTLE_S:
            return None
        return self.failing

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="pod-watch")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def created(self, pod: Pod) -> None:
        """A pod the provider just applied: in the cache until the server shows it."""
        name = pod_name(pod)
        if name and name not in self.pods:
            self.pods[name] = self._fresh[name] = pod

    def forget(self, name: str) -> None:
        """A pod the provider deletes: out of the cache now."""
        self.pods.pop(name, None)
        self._fresh.pop(name, None)

    async def _run(self) -> None:
        backoff = Backoff(RETRY_FIRST_S, RETRY_MAX_S)
        while True:
            try:
                if self.resource_version is None:
                    await self._list()
                else:
                    self.resumes += 1
                self._open_since = asyncio.get_running_loop().time()
                await self._follow(backoff)
            except Exception as exc:  # the task must not die: anything else is retried too
                self._open_since = None
                if is_gone(exc):  # history compacted: list again, at once
                    log.info("pod watch: %s; listing again", exc)
                    self.resource_version = None
                    continue
                self.failing = f"{type(exc).__name__}: {exc}"[:300]
                delay = backoff.next_delay()
                log.warning("pod watch broke (%s); again in %.1f s", self.failing, delay)
                await asyncio.sleep(delay)

    async def _list(self) -> None:
        pods, version = await self.api.list_pods(self.labels)
        listed = {pod_name(p): p for p in pods}
        for name in list(self._fresh):
            if name in listed:
                del self._fresh[name]
        self.pods = {**self._fresh, **listed}
        self.resource_version = version
        self.lists += 1
        self.failing = None
        self.synced.set()

    async def _follow(self, backoff: Backoff) -> None:
        """Apply events until the watch breaks (it raises) or the server ends it."""
        assert self.resource_version is not None  # noqa: S101 - set by a list first
        async for kind, pod in self.api.watch_pods(self.labels, self.resource_version):
            backoff.reset()
            self.failing = None
            self._event(kind, pod)

    def _event(self, kind: str, pod: Pod) -> None:
        if pod.metadata is not None and pod.metadata.resourceVersion:
            self.resource_version = pod.metadata.resourceVersion
        name = pod_name(pod)
        if kind == "BOOKMARK" or not name:
            return
        self._fresh.pop(name, None)
        if kind == "DELETED":
            self.pods.pop(name, None)
            if self._on_deleted is not None:
                self._on_deleted(name)
        else:
            self.pods[name] = pod
