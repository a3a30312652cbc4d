"""The REST verbs of the contract Kubernetes API server, on the :class:`Store`.

Paths: ``/api/v1/namespaces/{ns}/{pods,services,secrets,configmaps}[/{name}]``,
``/apis/{networking.k8s.io,policy,apps}/v1/namespaces/{ns}/{plural}[/{name}]``,
``/api/v1/nodes[/{name}]``, the same plurals without a namespace (every namespace),
``/version`` and the discovery roots. Verbs: ``GET`` (get; list with
``labelSelector``, ``fieldSelector``, ``limit``/``continue``; ``watch=true``),
``POST`` (create, 201, 409 ``AlreadyExists``), ``PUT`` (replace), ``PATCH``
(server-side apply with ``application/apply-patch+yaml`` and ``fieldManager``,
``force``; JSON merge patch), ``DELETE`` (a pod on a node is deleted gracefully:
202 with ``deletionTimestamp``, gone once its kubelet stopped it).

Every object received is validated against the OpenAPI schema of the server's
Kubernetes version (strict) and searched for a private key outside a Secret's data:
either is refused (422 ``Invalid``) and recorded in :attr:`Rest.violations`. Every
object sent is validated too; one that breaks the schema is this server's bug,
recorded the same way. Errors are ``Status`` objects; a bad or missing bearer token
is 401 ``Unauthorized``.
"""

from __future__ import annotations

import base64
import copy
import json
import secrets
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml  # type: ignore[import-untyped]

from tests.support.k8s_api import admission
from tests.support.k8s_api.apply import (
    apply,
    conflict_error,
    conflicts,
    managed_entry,
    merge_patch,
    remove,
)
from tests.support.k8s_api.rbac import Access, allowed, forbidden_message, request_verb
from tests.support.k8s_api.resources import (
    BY_PATH,
    ApiStatus,
    Obj,
    Resource,
    already_exists,
    invalid,
    not_found,
)
from tests.support.k8s_api.selectors import Match, parse_query
from tests.support.k8s_api.store import Store, now_iso
from tests.support.k8s_api.validation import private_key_places, schema_problems

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
QUERY = {
    "GET": {
        "pretty",
        "labelSelector",
        "fieldSelector",
        "limit",
        "continue",
        "resourceVersion",
        "resourceVersionMatch",
        "watch",
        "timeoutSeconds",
        "allowWatchBookmarks",
        "sendInitialEvents",
    },
    "POST": {"pretty", "dryRun", "fieldManager", "fieldValidation"},
    "PUT": {"pretty", "dryRun", "fieldManager", "fieldValidation"},
    "PATCH": {"pretty", "dryRun", "fieldManager", "fieldValidation", "force"},
    "DELETE": {"pretty", "dryRun", "gracePeriodSeconds", "propagationPolicy", "orphanDependents"},
}
"""The query parameters each verb's operations declare in the API's OpenAPI."""
RETURNS_DELETED = ("pods", "services")
"""Resources whose DELETE answers the deleted object (others answer a Status)."""


@dataclass(frozen=True)
class Incoming:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Mapping[str, str]
    raw: bytes


@dataclass
class Target:
    resource: Resource
    namespace: str | None
    """None: every namespace (a list or watch across them), or a cluster object."""
    name: str | None


@dataclass
class WatchSpec:
    target: Target
    rv: int | None
    """None: start with the current state (ADDED events), then follow."""
    match: Callable[[Obj], bool]
    timeout_s: float | None
    bookmarks: bool


@dataclass
class Reply:
    status: int
    body: Any = None
    watch: WatchSpec | None = None


@dataclass
class Hooks:
    """What the rest of the cluster does when the API changes objects."""

    changed: Callable[[], None] = lambda: None
    """After any write (the scheduler looks at pending pods)."""
    delete_pod: Callable[[Obj], bool] = lambda pod: False
    """A pod on a node is being deleted: True if its kubelet takes it from here."""


@dataclass
class Rest:
    store: Store
    version: str
    token: str
    namespaces: set[str]
    extended_resource_toleration: bool = False
    hooks: Hooks = field(default_factory=Hooks)
    violations: list[str] = field(default_factory=list)
    client_errors: list[str] = field(default_factory=list)
    expired_watches: int = 0
    """Watches told 410 Expired (see :meth:`count_expired`)."""
    requests: list[tuple[str, str, int]] = field(default_factory=list)
    """(method, path, status) of every request."""
    rules: list[Obj] | None = None
    """The client's RBAC rules (a Role's PolicyRules); None: everything is allowed."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def count_expired(self) -> None:
        """A watch was told 410 (an ERROR event in its stream: at its start, from a version
        older than the history, or later, when the history was dropped while it watched)."""
        with self._lock:
            self.expired_watches += 1

    # -- one request ------------------------------------------------------------------

    def handle(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        headers: Mapping[str, str],
        raw: bytes,
    ) -> Reply:
        try:
            reply = self._answer(Incoming(method, path, query, headers, raw))
        except ApiStatus as status:
            reply = Reply(status.code, status.body())
        with self._lock:
            self.requests.append((method, path, reply.status))
        return reply

    def _answer(self, req: Incoming) -> Reply:
        method, path, query, headers, raw = req.method, req.path, req.query, req.headers, req.raw
        given = headers.get("authorization") or ""
        if not secrets.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
            raise ApiStatus(401, "Unauthorized", "Unauthorized")
        found = self._discovery(method, path)
        if found is not None:
            return found
        target = self._target(path)
        unknown = sorted(set(query) - QUERY.get(method, set()))
        for name in unknown:
            self._client_error(f"{method} {path}: query parameter {name!r} is not declared")
        verb = self._verb(method, target, query)
        self._authorise(method, target, query)
        with self.store.lock:
            reply = verb(target, query, headers, raw)
        if method != "GET":
            self.hooks.changed()
        return reply

    def _verb(
        self, method: str, target: Target, query: dict[str, list[str]]
    ) -> Callable[..., Reply]:
        named = target.name is not None
        verbs: dict[tuple[str, bool], Callable[..., Reply]] = {
            ("GET", True): self._get,
            ("GET", False): self._watch if _flag(query, "watch") else self._list,
            ("POST", False): self._create,
            ("PUT", True): self._replace,
            ("PATCH", True): self._patch,
            ("DELETE", True): self._delete,
        }
        verb = verbs.get((method, named))
        if verb is None:
            raise ApiStatus(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
        return verb

    def _authorise(self, method: str, target: Target, query: dict[str, list[str]]) -> None:
        """RBAC: a request its rules do not allow is 403 (and a client error: the
        orchestrator's Role must cover what it does)."""
        if self.rules is None:
            return
        watch = _flag(query, "watch")
        access = Access(
            request_verb(method, target.name is not None, watch),
            target.resource.group,
            target.resource.plural,
            target.namespace,
            target.name,
        )
        if not allowed(self.rules, access):
            message = forbidden_message(access)
            self._client_error(f"{method} {target.resource.plural}: {message}")
            raise ApiStatus(403, "Forbidden", message)

    def _target(self, path: str) -> Target:
        parts = [p for p in path.split("/") if p]
        head = 2 if parts[:1] == ["api"] else 3
        prefix = "/" + "/".join(parts[:head])
        rest = parts[head:]
        namespace = None
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        resource = BY_PATH.get((prefix, rest[0])) if rest else None
        if resource is None or len(rest) > 2 or (namespace is not None and not resource.namespaced):
            self._client_error(f"{path}: no such resource here")
            raise ApiStatus(404, "NotFound", "the server could not find the requested resource")
        if namespace is not None and namespace not in self.namespaces:
            raise ApiStatus(
                404,
                "NotFound",
                f'namespaces "{namespace}" not found',
                {"name": namespace, "kind": "namespaces"},
            )
        name = rest[1] if len(rest) == 2 else None
        if name is not None and resource.namespaced and namespace is None:
            raise ApiStatus(404, "NotFound", "the server could not find the requested resource")
        return Target(resource, namespace, name)

    # -- discovery --------------------------------------------------------------------

    def _discovery(self, method: str, path: str) -> Reply | None:
        if method != "GET":
            return None
        major, minor, _ = self.version.split(".")
        roots: dict[str, Obj] = {
            "/version": {
                "major": major,
                "minor": minor,
                "gitVersion": f"v{self.version}",
                "gitCommit": "0" * 40,
                "gitTreeState": "clean",
                "buildDate": "2025-01-01T00:00:00Z",
                "goVersion": "go1.23",
                "compiler": "gc",
                "platform": "linux/amd64",
            },
            "/api": {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}
                ],
            },
            "/apis": {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {
                        "name": g,
                        "versions": [{"groupVersion": f"{g}/v1", "version": "v1"}],
                        "preferredVersion": {"groupVersion": f"{g}/v1", "version": "v1"},
                    }
                    for g in sorted({r.group for r in BY_PATH.values() if r.group})
                ],
            },
        }
        body = roots.get(path.rstrip("/"))
        return Reply(200, body) if body is not None else None

    # -- reads ------------------------------------------------------------------------

    def _key(self, target: Target, name: str | None = None) -> tuple[str, str, str]:
        return (target.resource.plural, target.namespace or "", name or target.name or "")

    def _live(self, target: Target) -> Obj:
        obj = self.store.get(self._key(target))
        if obj is None:
            raise not_found(target.resource, target.name or "")
        return obj

    def _get(self, target: Target, query: dict[str, list[str]], *_: Any) -> Reply:
        return Reply(200, self.shown(target.resource, self._live(target)))

    def _matcher(self, query: dict[str, list[str]]) -> Callable[[Obj], bool]:
        labels: Match = parse_query(_last(query, "labelSelector") or "")
        fields: Match = parse_query(_last(query, "fieldSelector") or "")
        return lambda obj: labels(obj["metadata"].get("labels") or {}) and fields(_fields(obj))

    def _list(self, target: Target, query: dict[str, list[str]], *_: Any) -> Reply:
        match = self._matcher(query)
        items = [o for o in self.store.items(target.resource.plural, target.namespace) if match(o)]
        meta: Obj = {"resourceVersion": str(self.store.rv)}
        token = _last(query, "continue")
        if token:
            start = _decode_continue(token)
            items = [o for o in items if _order(o) > start]
        limit = int(_last(query, "limit") or 0)
        if limit and len(items) > limit:
            meta["continue"] = _encode_continue(_order(items[limit - 1]))
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        shown = [self.shown(target.resource, o) for o in items]
        for item in shown:
            item.pop("kind", None)
            item.pop("apiVersion", None)
        body = {
            "kind": f"{target.resource.kind}List",
            "apiVersion": target.resource.api_version,
            "metadata": meta,
            "items": shown,
        }
        return Reply(200, body)

    def _watch(self, target: Target, query: dict[str, list[str]], *_: Any) -> Reply:
        raw_rv = _last(query, "resourceVersion")
        rv = int(raw_rv) if raw_rv not in (None, "", "0") else None
        if raw_rv is not None and raw_rv != "" and not raw_rv.isdigit():
            raise ApiStatus(400, "BadRequest", f"invalid resource version: {raw_rv}")
        timeout = _last(query, "timeoutSeconds")
        spec = WatchSpec(
            target,
            rv,
            self._matcher(query),
            float(timeout) if timeout else None,
            _flag(query, "allowWatchBookmarks"),
        )
        return Reply(200, watch=spec)

    # -- writes -----------------------------------------------------------------------

    def _body(self, headers: Mapping[str, str], raw: bytes, target: Target, what: str) -> Obj:
        media = (headers.get("content-type") or "application/json").split(";")[0].strip()
        try:
            body = yaml.safe_load(raw) if media == APPLY else json.loads(raw)
        except (ValueError, yaml.YAMLError):
            raise ApiStatus(
                400,
                "BadRequest",
                f"the {what} body is not valid {'YAML' if media == APPLY else 'JSON'}",
            ) from None
        if not isinstance(body, dict):
            raise ApiStatus(400, "BadRequest", f"the {what} body is not an object")
        return body

    def _received(self, method: str, target: Target, obj: Obj) -> None:
        """Schema and private-key checks of an object as a client sent it; 422 if bad."""
        resource, name = target.resource, (obj.get("metadata") or {}).get("name", "")
        where = f"{method} {resource.kind}/{name}"
        if obj.get("apiVersion") != resource.api_version or obj.get("kind") != resource.kind:
            cause = (
                "FieldValueInvalid",
                "kind",
                f"expected {resource.api_version}/{resource.kind}, "
                f"got {obj.get('apiVersion')}/{obj.get('kind')}",
            )
            self._violation(f"client: {where}: {cause[2]}")
            raise ApiStatus(
                400, "BadRequest", f"the object of {where} is not a {resource.kind}: {cause[2]}"
            )
        causes = [
            ("FieldValueInvalid", path, message)
            for path, message in schema_problems(obj, self.version)
        ]
        causes += [
            ("FieldValueForbidden", path, "Forbidden: a private key outside a Secret's data")
            for path in private_key_places(obj)
        ]
        if causes:
            for _, path, message in causes:
                self._violation(f"client: {where}: {path}: {message}")
            raise invalid(resource, name, causes)
        ns = obj["metadata"].get("namespace")
        if ns is not None and target.namespace is not None and ns != target.namespace:
            raise ApiStatus(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on "
                "the request",
            )

    def _create(
        self, target: Target, query: dict[str, list[str]], headers: Mapping[str, str], raw: bytes
    ) -> Reply:
        if target.namespace is None and target.resource.namespaced:
            raise ApiStatus(405, "MethodNotAllowed", "create needs a namespace")
        obj = self._body(headers, raw, target, "create")
        self._received("POST", target, obj)
        name = obj["metadata"].get("name")
        if not name:
            raise invalid(
                target.resource,
                "",
                [
                    (
                        "FieldValueRequired",
                        "metadata.name",
                        "Required value: name or generateName is required",
                    )
                ],
            )
        if self.store.get(self._key(target, name)) is not None:
            raise already_exists(target.resource, name)
        manager = _last(query, "fieldManager") or "unknown"
        return Reply(201, self._store_new(target, obj, manager, "Update", query))

    def _store_new(
        self, target: Target, obj: Obj, manager: str, operation: str, query: dict[str, list[str]]
    ) -> Obj:
        given = {k: v for k, v in obj.items() if k != "status" or not target.resource.has_status}
        new = admission.defaulted(
            given,
            target.resource.kind,
            extended_resource_toleration=self.extended_resource_toleration,
        )
        meta = new["metadata"]
        meta["managedFields"] = [
            managed_entry(manager, operation, target.resource.api_version, obj)
        ]
        if "spec" in new:
            meta["generation"] = 1
        if _last(query, "dryRun"):
            return self.shown(target.resource, new)
        if operation == "Apply":
            self.store.applied.setdefault(self._key(target, meta["name"]), {})[manager] = (
                copy.deepcopy(obj)
            )
        return self.shown(
            target.resource, self.store.create(target.resource, target.namespace or "", new)
        )

    def _patch(
        self, target: Target, query: dict[str, list[str]], headers: Mapping[str, str], raw: bytes
    ) -> Reply:
        media = (headers.get("content-type") or "").split(";")[0].strip()
        if media == APPLY:
            return self._apply(target, query, headers, raw)
        if media != MERGE:
            self._client_error(
                f"PATCH {target.resource.kind}: {media or 'no'} patch type is not played here"
            )
            raise ApiStatus(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types "
                f"include: {APPLY}, {MERGE}",
            )
        live = self._live(target)
        patched = merge_patch(live, self._body(headers, raw, target, "patch"))
        self._received("PATCH", target, patched)
        return Reply(200, self._store_update(target, live, patched, query))

    def _apply(
        self, target: Target, query: dict[str, list[str]], headers: Mapping[str, str], raw: bytes
    ) -> Reply:
        manager = _last(query, "fieldManager")
        if not manager:
            raise ApiStatus(
                400,
                "BadRequest",
                "PATCH, application/apply-patch+yaml requests require fieldManager",
            )
        config = self._body(headers, raw, target, "apply")
        self._received("PATCH", target, config)
        if config["metadata"].get("name") != target.name:
            raise ApiStatus(
                400, "BadRequest", "the name of the object does not match the name on the URL"
            )
        if target.resource.has_status:
            config.pop("status", None)
        key = self._key(target)
        live = self.store.get(key)
        if live is None:
            return Reply(201, self._store_new(target, config, manager, "Apply", query))
        managers = self.store.applied.setdefault(key, {})
        found = conflicts(config, manager, managers)
        if found and not _flag(query, "force"):
            raise conflict_error(found, target.resource.api_version)
        for other, path in found:  # forced: the fields change hands
            remove(managers[other], path)
        merged = apply(
            live, config, managers.get(manager), {m: c for m, c in managers.items() if m != manager}
        )
        reply = self._store_update(target, live, merged, query, manager=manager, config=config)
        if not _last(query, "dryRun"):
            managers[manager] = copy.deepcopy(config)
        return Reply(200, reply)

    def _replace(
        self, target: Target, query: dict[str, list[str]], headers: Mapping[str, str], raw: bytes
    ) -> Reply:
        obj = self._body(headers, raw, target, "update")
        self._received("PUT", target, obj)
        live = self._live(target)
        sent_rv = obj["metadata"].get("resourceVersion")
        if sent_rv and sent_rv != live["metadata"]["resourceVersion"]:
            raise ApiStatus(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {target.resource.plural} "{target.name}": '
                "the object has been modified; please apply your changes to the latest "
                "version and try again",
            )
        new = dict(obj, metadata={**live["metadata"], **obj["metadata"]})
        if target.resource.has_status:
            new["status"] = live.get("status")
        return Reply(200, self._store_update(target, live, new, query))

    def _store_update(
        self,
        target: Target,
        live: Obj,
        new: Obj,
        query: dict[str, list[str]],
        *,
        manager: str | None = None,
        config: Obj | None = None,
    ) -> Obj:
        name = live["metadata"]["name"]
        new = admission.defaulted(
            new,
            target.resource.kind,
            extended_resource_toleration=self.extended_resource_toleration,
        )
        if target.resource.kind == "Pod":
            admission.check_pod_update(name, live, new)
        for kept in ("uid", "creationTimestamp", "namespace", "deletionTimestamp"):
            if kept in live["metadata"]:
                new["metadata"][kept] = live["metadata"][kept]
        if new.get("spec") != live.get("spec"):
            new["metadata"]["generation"] = int(live["metadata"].get("generation", 1)) + 1
        if manager is not None and config is not None:
            new["metadata"]["managedFields"] = _managed(
                live, manager, managed_entry(manager, "Apply", target.resource.api_version, config)
            )
        if new == live or _last(query, "dryRun"):
            return self.shown(target.resource, new)
        return self.shown(
            target.resource, self.store.update(target.resource.plural, target.namespace or "", new)
        )

    def _delete(self, target: Target, query: dict[str, list[str]], *_: Any) -> Reply:
        live = self._live(target)
        if _last(query, "dryRun"):
            return Reply(200, self.shown(target.resource, live))
        grace = _last(query, "gracePeriodSeconds")
        if target.resource.plural == "pods" and live["spec"].get("nodeName") and grace != "0":
            if "deletionTimestamp" not in live["metadata"]:
                live["metadata"]["deletionTimestamp"] = now_iso()
                live["metadata"]["deletionGracePeriodSeconds"] = int(
                    grace or live["spec"].get("terminationGracePeriodSeconds", 30)
                )
                live = self.store.update("pods", target.namespace or "", live)
            if self.hooks.delete_pod(live):
                return Reply(202, self.shown(target.resource, live))
        gone = self.store.delete(*self._key(target))
        assert gone is not None
        if target.resource.plural in RETURNS_DELETED:
            return Reply(200, self.shown(target.resource, gone))
        details = {
            "name": target.name,
            "group": target.resource.group,
            "kind": target.resource.plural,
            "uid": gone["metadata"]["uid"],
        }
        return Reply(200, _success(details))

    # -- what is sent -----------------------------------------------------------------

    def shown(self, resource: Resource, obj: Obj) -> Obj:
        """An object as the API sends it (checked against the schema: a failure is this
        server's bug, recorded)."""
        out = copy.deepcopy(obj)
        out["apiVersion"], out["kind"] = resource.api_version, resource.kind
        for path, message in schema_problems(out, self.version):
            self._violation(
                f"server: {resource.kind}/{out['metadata'].get('name')}: {path}: {message}"
            )
        return out

    def _violation(self, line: str) -> None:
        with self._lock:
            self.violations.append(line)

    def _client_error(self, line: str) -> None:
        with self._lock:
            self.client_errors.append(line)


def _managed(live: Obj, manager: str, entry: Obj) -> list[Obj]:
    """``live``'s managed fields with ``entry`` for ``manager``'s apply (its old entry
    kept, time included, when its fields did not change)."""
    entries = live["metadata"].get("managedFields", [])
    mine = [e for e in entries if e["manager"] == manager and e["operation"] == "Apply"]
    if mine and mine[0]["fieldsV1"] == entry["fieldsV1"]:
        return list(entries)
    return [*(e for e in entries if e not in mine), entry]


def _success(details: Obj) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    }


def _last(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return (_last(query, name) or "").lower() in ("true", "1")


def _fields(obj: Obj) -> dict[str, str]:
    meta = obj["metadata"]
    out = {"metadata.name": meta["name"], "metadata.namespace": meta.get("namespace", "")}
    if obj.get("kind") == "Pod" or "nodeName" in obj.get("spec", {}):
        out["spec.nodeName"] = obj["spec"].get("nodeName", "")
        out["status.phase"] = (obj.get("status") or {}).get("phase", "")
    return out


def _order(obj: Obj) -> str:
    return f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"


def _encode_continue(after: str) -> str:
    return base64.urlsafe_b64encode(json.dumps({"start": after}).encode()).decode()


def _decode_continue(token: str) -> str:
    try:
        return str(json.loads(base64.urlsafe_b64decode(token.encode()))["start"])
    except (ValueError, KeyError, TypeError):
        raise ApiStatus(400, "BadRequest", "continue key is not valid") from None
