"""Objects by resource, namespace and name, each change a numbered event.

One ``resourceVersion`` counter for every object (as etcd's revision): each write
takes the next number, stamps it on the object and appends an event (``ADDED``,
``MODIFIED``, ``DELETED``) to the history a watch reads. :meth:`Store.compact` drops
the history (as etcd's compaction does): a watch from an older version is then told
``Expired``. :meth:`Store.drop_watches` ends every open watch (a server restart, a
load balancer's idle timeout): a client resumes from the last version it saw.
Thread-safe: one lock for everything.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from tests.support.k8s_api.resources import Obj, Resource

Key = tuple[str, str, str]
"""(plural, namespace ('' for cluster objects), name)."""


@dataclass(frozen=True)
class Event:
    rv: int
    type: str
    plural: str
    namespace: str
    obj: Obj


class Expired(Exception):
    """The history no longer reaches back to the version asked for."""

    def __init__(self, asked: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {asked} ({oldest})")


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Store:
    objects: dict[Key, Obj] = field(default_factory=dict)
    applied: dict[Key, dict[str, Obj]] = field(default_factory=dict)
    """What each field manager last applied to an object (server-side apply's memory;
    never shown, never an annotation)."""
    history: list[Event] = field(default_factory=list)
    rv: int = 1
    oldest: int = 1
    """The oldest version a watch may start from."""
    watch_epoch: int = 0
    watching: int = 0
    """Watch streams open now."""
    closing: bool = False
    creates: Counter[str] = field(default_factory=Counter)
    """Creates per pod name (``namespace/name``)."""
    lock: threading.RLock = field(default_factory=threading.RLock)
    listeners: list[Callable[[Event], None]] = field(default_factory=list)
    """Called (under the lock) after each write: the scheduler and the kubelet."""

    def get(self, key: Key) -> Obj | None:
        with self.lock:
            found = self.objects.get(key)
            return copy.deepcopy(found) if found is not None else None

    def items(self, plural: str, namespace: str | None = None) -> list[Obj]:
        with self.lock:
            return [
                copy.deepcopy(o)
                for (p, ns, _), o in sorted(self.objects.items())
                if p == plural and (namespace is None or ns == namespace)
            ]

    def create(self, resource: Resource, namespace: str, obj: Obj) -> Obj:
        """Stamp ``uid``, ``creationTimestamp`` and the next version; ``ADDED``."""
        meta = obj["metadata"]
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_iso()
        if resource.namespaced:
            meta["namespace"] = namespace
        if resource.plural == "pods":
            self.creates[f"{namespace}/{meta['name']}"] += 1
        return self._write("ADDED", resource.plural, namespace, obj)

    def update(self, plural: str, namespace: str, obj: Obj) -> Obj:
        return self._write("MODIFIED", plural, namespace, obj)

    def delete(self, plural: str, namespace: str, name: str) -> Obj | None:
        with self.lock:
            key = (plural, namespace, name)
            obj = self.objects.get(key)
            if obj is None:
                return None
            self.applied.pop(key, None)
            return self._write("DELETED", plural, namespace, copy.deepcopy(obj))

    def _write(self, kind: str, plural: str, namespace: str, obj: Obj) -> Obj:
        with self.lock:
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            key = (plural, namespace, obj["metadata"]["name"])
            if kind == "DELETED":
                self.objects.pop(key, None)
            else:
                self.objects[key] = obj
            event = Event(self.rv, kind, plural, namespace, copy.deepcopy(obj))
            self.history.append(event)
            for listener in list(self.listeners):
                listener(event)
            return copy.deepcopy(obj)

    def since(self, rv: int, plural: str, namespace: str | None) -> list[Event]:
        """Events after version ``rv`` of one resource; :class:`Expired` if the history
        was compacted past it."""
        with self.lock:
            if rv < self.oldest:
                raise Expired(rv, self.oldest)
            return [
                e
                for e in self.history
                if e.rv > rv and e.plural == plural and namespace in (None, e.namespace)
            ]

    def compact(self) -> int:
        """Drop the history up to now; returns the oldest version still watchable."""
        with self.lock:
            self.history.clear()
            self.oldest = self.rv
            return self.oldest

    def drop_watches(self) -> None:
        """End every open watch (its stream ends, as at a watch's timeout)."""
        with self.lock:
            self.watch_epoch += 1
