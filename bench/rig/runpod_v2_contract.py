"""A contract server for RunPod's REST API v2, checked mechanically against RunPod's schema.

Every request is matched to an operation of RunPod's OpenAPI document (the reduced copy
``runpod_openapi_v2.json``, :mod:`bench.rig.runpod_schema`) and validated before it is
handled: a body that breaks the schema (an unknown field, a missing ``name``) is refused
with ``422`` and RunPod's problem format (RFC 9457: ``title``, ``status``, ``detail``,
``errors``, one line per failure naming the field); a bad query parameter with ``400``.
Every response is validated before it is sent: one that breaks the schema is a bug of
this server, recorded in :attr:`ContractServer.violations` and answered ``500`` so the
test notices. Requests the schema would refuse, and anything it does not declare (a
path, a query parameter), are recorded in :attr:`ContractServer.client_errors`.

Operations played, with state in memory: ``GET/POST /v2/pods``,
``GET/PATCH/DELETE /v2/pods/{id}``, ``POST /v2/pods/{id}/action`` (start, stop,
restart, terminate; ``409`` when the pod's status does not allow it),
``GET /v2/pods/{id}/logs`` (Server-Sent Events, held open as RunPod does),
``GET /v2/catalog/gpus`` (``include=AVAILABILITY&product=POD``: stock),
``GET /v2/catalog/datacenters``, ``GET/POST /v2/network-volumes``,
``GET/DELETE /v2/network-volumes/{id}``, ``GET/POST /v2/templates``,
``GET /v2/templates/{id}``, ``GET/POST /v2/serverless``,
``GET/PATCH/DELETE /v2/serverless/{id}``. Any other operation of the schema answers
``404`` (recorded as a client error: the server does not play it). Bearer key, ``401``
otherwise.

A pod goes ``PROVISIONING`` -> ``STARTING`` -> ``RUNNING`` on the server's clock
(:attr:`Knobs.provision_s`, :attr:`Knobs.start_s`; a test may pass its own clock). A
``launcher`` may back each pod with a real process (``framerelay worker``): it is called
when the pod starts, and the pod is ``RUNNING`` once it returns; ``runtime.ports`` then
maps the pod's ``N/tcp`` ports to what it listens on. Without one, the ports map to free
ports on 127.0.0.1 where nothing listens. Prices come from the catalog
(:data:`GPUS`): a pod's ``cost`` is its cloud's price times ``gpu.count`` (0 when
``EXITED``).

The awkward cases, as knobs (:class:`Knobs`) and methods: no stock for a GPU type and
cloud (create answers ``400`` with RunPod's human-readable detail, the catalog shows
``NONE``); a ``500`` after the pod was made; community pods that never get a public IP
or port (``ip``/``public`` null); the next pods failing at boot (``ERROR``, the reason
in the pod's ``system`` log); :meth:`ContractServer.fail_pod` for a running pod;
``500``s and ``429``s before any handling. RunPod's schema defines no paging (the lists
are ``{"pods": [...]}`` whole, with no cursor or page parameter): none is played.
"""

from __future__ import annotations

import asyncio
import http
import json
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from bench.rig.common import free_port
from bench.rig.runpod_schema import RunPodSchema, default_schema
from bench.rig.serving import serve_in_thread

NO_CAPACITY = (
    "There are no longer any instances available with the requested specifications. "
    "Please refresh and try again."
)
"""RunPod's words for no stock (its create answers 400 with this as ``detail``)."""
LOGS = "/v2/pods/{id}/logs"
LOG_POLL_S = 0.05
JSON = "application/json"
PROBLEM = "application/problem+json"
EVENTS = "text/event-stream"
DEFAULT_DISK_GB = 50
ACTIONS = {
    "PROVISIONING": ("stop", "terminate"),
    "STARTING": ("stop", "terminate"),
    "RUNNING": ("stop", "restart", "terminate"),
    "EXITED": ("start", "terminate"),
    "ERROR": ("start", "terminate"),
    "TERMINATED": (),
}
"""What each pod status allows (``podAction``'s description)."""


@dataclass(frozen=True)
class GpuOffer:
    """One GPU type of the catalog (prices are illustrative, $ per GPU per hour)."""

    id: str
    name: str
    memory_gb: int
    secure: float
    community: float
    pool: str | None = None
    serverless: float | None = None
    max_count: int = 8
    data_centres: tuple[str, ...] = ("EU-RO-1", "US-KS-2", "EU-SE-1")
    cuda_versions: tuple[str, ...] = ("12.4", "12.8")


@dataclass(frozen=True)
class DataCentre:
    id: str
    name: str
    region: str
    country: str
    volume_types: tuple[str, ...] = ("STANDARD",)
    global_network: bool = False


GPUS: tuple[GpuOffer, ...] = (
    GpuOffer("NVIDIA RTX A4000", "RTX A4000", 16, 0.32, 0.20, "AMPERE_16", 0.58),
    GpuOffer("NVIDIA RTX A5000", "RTX A5000", 24, 0.36, 0.26, "AMPERE_24", 0.69),
    GpuOffer("NVIDIA L4", "L4", 24, 0.43, 0.30, "ADA_24", 0.69),
)
DATA_CENTRES: tuple[DataCentre, ...] = (
    DataCentre("EU-RO-1", "Romania", "EUROPE", "RO", ("STANDARD", "HIGH_PERFORMANCE")),
    DataCentre("US-KS-2", "Kansas", "NORTH_AMERICA", "US", global_network=True),
    DataCentre("EU-SE-1", "Sweden", "EUROPE", "SE"),
)

Launcher = Callable[[dict[str, Any]], tuple[str, int | Mapping[int, int], Callable[[], None]]]
"""pod (as ``GET /v2/pods/{id}`` shows it) -> (ip, the public port of its first ``N/tcp``
port or {private port: public port}, stop function). Runs in a thread of its own; an
exception puts the pod in ``ERROR`` with the exception as the reason."""


@dataclass
class Knobs:
    """The awkward cases the next requests meet; counters count down."""

    provision_s: float = 0.0
    """Seconds a new pod stays ``PROVISIONING``."""
    start_s: float = 0.0
    """Seconds a pod stays ``STARTING`` at least (and until its launcher returns)."""
    no_stock: set[tuple[str, str]] = field(default_factory=set)
    """(GPU type id, cloud) without stock; cloud ``*``: every cloud."""
    fail_after_create: int = 0
    """The next N pod creates make the pod, then answer 500."""
    community_public_ip: bool = True
    """False: community pods never get a public IP or port."""
    boot_errors: list[str] = field(default_factory=list)
    """The next pods to start go to ``ERROR`` instead, each with the next reason."""
    fail_next: int = 0
    """Answer the next N authenticated requests with 500 (nothing done)."""
    rate_limit_next: int = 0
    """Answer the next N authenticated requests with 429 and ``Retry-After``."""
    retry_after_s: int = 0
    serverless_url: str = "https://api.runpod.ai/v2"
    """Where an endpoint's ``requestUrls`` point (a serverless contract server's URL)."""


@dataclass
class Exchange:
    """One request as the server saw it (the query's names only, never its values)."""

    method: str
    path: str
    template: str | None
    query_names: list[str]
    status: int = 0
    request_errors: list[str] = field(default_factory=list)
    response_errors: list[str] = field(default_factory=list)
    unknown_query: list[str] = field(default_factory=list)


class Problem(Exception):
    """An answer in RunPod's problem format (RFC 9457)."""

    def __init__(
        self,
        status: int,
        detail: str,
        errors: list[str] | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(detail)
        self.status, self.detail, self.errors, self.retry_after = (
            status,
            detail,
            errors,
            retry_after,
        )

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "title": http.HTTPStatus(self.status).phrase,
            "status": self.status,
            "detail": self.detail,
        }
        if self.errors:
            out["errors"] = self.errors
        return out


@dataclass
class Reply:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    media: str | None = JSON


@dataclass
class Call:
    """A validated request, as a handler gets it."""

    params: dict[str, str]
    query: dict[str, list[str]]
    body: Any
    stops: list[Callable[[], None]] = field(default_factory=list)
    """Stop functions of processes to end once the state lock is released."""

    def csv(self, name: str) -> list[str]:
        return [v for raw in self.query.get(name, []) for v in raw.split(",") if v]

    def flag(self, name: str) -> bool | None:
        raw = self.query.get(name)
        return None if not raw else raw[-1] == "true"


@dataclass
class PodRecord:
    """A pod's state; :meth:`ContractServer.pod_view` shows it as RunPod does."""

    id: str
    name: str
    image: str
    args: str
    disk: int
    ports: list[str]
    env: dict[str, str]
    registry: str | None
    mounts: dict[str, Any]
    gpu: dict[str, Any]
    cloud: str
    data_centre: str
    cuda: str
    template: str | None
    price: float
    public_ip: bool
    created_at: str
    status: str = "PROVISIONING"
    since: float = 0.0
    locked: bool = False
    global_networking: bool = False
    started_at: str | None = None
    boot_error: str | None = None
    launch_error: str | None = None
    launched: tuple[str, dict[int, int], Callable[[], None]] | None = None
    generation: int = 0
    """Bumped whenever the pod's process is let go: a launch of an older generation is
    stopped when it returns."""
    mapping: dict[int, tuple[str | None, int | None]] = field(default_factory=dict)
    logs: list[tuple[str, str, str]] = field(default_factory=list)
    """(event id, source, line)."""

    def log(self, source: str, line: str) -> None:
        ts = _now()
        self.logs.append((f"{ts}/{len(self.logs) + 1:012d}", source, line))

    def tcp_ports(self) -> list[int]:
        return [int(p.split("/")[0]) for p in self.ports if p.endswith("/tcp")]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _new_id() -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(10))


def _cuda_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


Handler = Callable[[Call], Reply]


class ContractServer:
    """RunPod v2's state in memory, every exchange checked against RunPod's schema."""

    def __init__(
        self,
        api_key: str,
        *,
        launcher: Launcher | None = None,
        clock: Callable[[], float] = time.monotonic,
        gpus: tuple[GpuOffer, ...] = GPUS,
        data_centres: tuple[DataCentre, ...] = DATA_CENTRES,
        schema: RunPodSchema | None = None,
    ) -> None:
        self.api_key = api_key
        self.launcher = launcher
        self.clock = clock
        self.gpus = {g.id: g for g in gpus}
        self.data_centres = {d.id: d for d in data_centres}
        self.schema = schema or default_schema()
        self.knobs = Knobs()
        self.pods: dict[str, PodRecord] = {}
        self.volumes: dict[str, dict[str, Any]] = {}
        self.templates: dict[str, dict[str, Any]] = {}
        self.endpoints: dict[str, dict[str, Any]] = {}
        self.exchanges: list[Exchange] = []
        self.key_in_url = False
        """Whether a request carried the API key in its URL (it belongs in a header)."""
        self.closing = False
        self._lock = threading.RLock()
        self._handlers = self._routes()

    # -- what a test reads -------------------------------------------------------

    @property
    def violations(self) -> list[str]:
        """Responses this server sent that broke RunPod's schema: its own bugs (each was
        answered 500 instead). Empty at the end of every test."""
        return [
            f"{e.method} {e.path} -> {e.status}: {error}"
            for e in list(self.exchanges)
            for error in e.response_errors
        ]

    @property
    def client_errors(self) -> list[str]:
        """What clients sent that RunPod's schema refuses or does not declare (a body,
        a parameter, an operation), or that this server does not play."""
        out: list[str] = []
        for e in list(self.exchanges):
            out += [f"{e.method} {e.path}: {error}" for error in e.request_errors]
            out += [
                f"{e.method} {e.path}: query parameter {name!r} is not in RunPod's schema"
                for name in e.unknown_query
            ]
        return out

    def requests(self, method: str, template: str) -> list[Exchange]:
        """The exchanges of one operation (``"POST", "/v2/pods"``)."""
        return [e for e in list(self.exchanges) if (e.method, e.template) == (method, template)]

    # -- what a test does to pods behind the API's back ---------------------------

    def fail_pod(self, pod_id: str, reason: str) -> None:
        """The pod's container dies: ``ERROR``, its process stopped, ``reason`` in its
        ``system`` log."""
        stops: list[Callable[[], None]] = []
        with self._lock:
            pod = self.pods[pod_id]
            self._stop_process(pod, stops)
            self._enter(pod, "ERROR")
            pod.log("system", reason)
        _run(stops)

    def vanish(self, pod_id: str) -> None:
        """The pod is gone (its host was lost): its process stops, the API answers 404."""
        stops: list[Callable[[], None]] = []
        with self._lock:
            pod = self.pods.pop(pod_id)
            self._stop_process(pod, stops)
        _run(stops)

    def close(self) -> None:
        """Stop every pod's process (the server is going away)."""
        stops: list[Callable[[], None]] = []
        with self._lock:
            self.closing = True
            for pod in self.pods.values():
                self._stop_process(pod, stops)
        _run(stops)

    # -- one exchange ---------------------------------------------------------------

    def handle(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        headers: Mapping[str, str],
        raw: bytes,
    ) -> tuple[Reply, Exchange]:
        """Answer one request: authenticated, validated, handled, the answer validated."""
        shown = path.replace(self.api_key, "<API key>") if self.api_key else path
        exchange = Exchange(method, shown, self.schema.template_of(method, path), sorted(query))
        with self._lock:
            self.exchanges.append(exchange)
        stops: list[Callable[[], None]] = []
        try:
            reply = self._answer(exchange, query, headers, raw, stops)
        except Problem as problem:
            reply = _problem(problem)
        finally:
            _run(stops)
        return self._checked(exchange, reply), exchange

    def _answer(
        self,
        exchange: Exchange,
        query: dict[str, list[str]],
        headers: Mapping[str, str],
        raw: bytes,
        stops: list[Callable[[], None]],
    ) -> Reply:
        given = headers.get("authorization") or ""
        if not secrets.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
            raise Problem(401, "invalid API key" if given else "missing bearer token")
        if exchange.template is None:
            exchange.request_errors.append("no such operation in RunPod's schema")
            raise Problem(404, f"no route {exchange.method} {exchange.path}")
        self._faults()
        call = self._validated(exchange, exchange.template, query, headers, raw)
        call.stops = stops
        handler = self._handlers.get((exchange.method, exchange.template))
        if handler is None:
            exchange.request_errors.append("operation not played by the contract server")
            raise Problem(404, f"{exchange.method} {exchange.template} is not played here")
        with self._lock:
            return handler(call)

    def _faults(self) -> None:
        with self._lock:
            if self.knobs.rate_limit_next > 0:
                self.knobs.rate_limit_next -= 1
                limit = "rate limit exceeded for the minute window"
                raise Problem(429, limit, retry_after=self.knobs.retry_after_s)
            if self.knobs.fail_next > 0:
                self.knobs.fail_next -= 1
                raise Problem(500, "internal error")

    def _validated(
        self,
        exchange: Exchange,
        template: str,
        query: dict[str, list[str]],
        headers: Mapping[str, str],
        raw: bytes,
    ) -> Call:
        body: Any = None
        if raw.strip():
            try:
                body = json.loads(raw)
            except ValueError:
                exchange.request_errors.append("$: the body is not JSON")
                raise Problem(400, "the request body is not JSON") from None
        media = (headers.get("content-type") or JSON).split(";")[0].strip()
        params = self.schema.path_params(template, exchange.path)
        check = self.schema.check_request(exchange.method, template, body, query, params, media)
        exchange.unknown_query = check.unknown_query
        if check.errors:
            exchange.request_errors += check.errors
            op = self.schema.operation(exchange.method, template)
            in_body = any(e.startswith("$") for e in check.errors)
            if in_body and "422" in op.responses:
                raise Problem(422, "Request validation failed.", check.errors)
            raise Problem(400, "Request validation failed.", check.errors)
        return Call(params, query, body)

    def _checked(self, exchange: Exchange, reply: Reply) -> Reply:
        exchange.status = reply.status
        if exchange.template is None:
            return reply
        media = reply.media if reply.body is not None else None
        errors = self.schema.check_response(
            exchange.method, exchange.template, reply.status, reply.body, media
        )
        if not errors:
            return reply
        exchange.response_errors += errors
        exchange.status = 500
        detail = f"contract server bug: its {reply.status} answer broke RunPod's schema"
        return _problem(Problem(500, detail, errors))

    def _routes(self) -> dict[tuple[str, str], Handler]:
        return {
            ("GET", "/v2/pods"): self._list_pods,
            ("POST", "/v2/pods"): self._create_pod,
            ("GET", "/v2/pods/{id}"): self._get_pod,
            ("PATCH", "/v2/pods/{id}"): self._patch_pod,
            ("DELETE", "/v2/pods/{id}"): self._delete_pod,
            ("POST", "/v2/pods/{id}/action"): self._pod_action,
            ("GET", LOGS): self._logs,
            ("GET", "/v2/catalog/gpus"): self._catalog_gpus,
            ("GET", "/v2/catalog/datacenters"): self._catalog_data_centres,
            ("GET", "/v2/network-volumes"): self._list_volumes,
            ("POST", "/v2/network-volumes"): self._create_volume,
            ("GET", "/v2/network-volumes/{id}"): self._get_volume,
            ("DELETE", "/v2/network-volumes/{id}"): self._delete_volume,
            ("GET", "/v2/templates"): self._list_templates,
            ("POST", "/v2/templates"): self._create_template,
            ("GET", "/v2/templates/{id}"): self._get_template,
            ("GET", "/v2/serverless"): self._list_endpoints,
            ("POST", "/v2/serverless"): self._create_endpoint,
            ("GET", "/v2/serverless/{id}"): self._get_endpoint,
            ("PATCH", "/v2/serverless/{id}"): self._patch_endpoint,
            ("DELETE", "/v2/serverless/{id}"): self._delete_endpoint,
        }

    # -- pods -----------------------------------------------------------------------

    def _pod(self, call: Call) -> PodRecord:
        pod = self.pods.get(call.params["id"])
        if pod is None:
            raise Problem(404, "pod not found")
        return pod

    def _list_pods(self, call: Call) -> Reply:
        return Reply(200, {"pods": [self._shown(p, call.stops) for p in self.pods.values()]})

    def _get_pod(self, call: Call) -> Reply:
        return Reply(200, self._shown(self._pod(call), call.stops))

    def _create_pod(self, call: Call) -> Reply:
        body = self._with_template(dict(call.body))
        if ("gpu" in body) == ("cpu" in body):
            raise Problem(400, "give exactly one of gpu or cpu")
        if "cpu" in body:
            raise Problem(400, "CPU pods are not played by this contract server")
        gpu = {"id": body["gpu"]["id"], "count": body["gpu"].get("count", 1)}
        offer = self._offer(gpu["id"], gpu["count"])
        cloud = body.get("cloud", "SECURE")
        mounts = body.get("mounts", {})
        centre = self._place(offer, cloud, body.get("dataCenterIds") or [], mounts)
        price = offer.community if cloud == "COMMUNITY" else offer.secure
        pod = PodRecord(
            id=_new_id(),
            name=body["name"],
            image=body["image"],
            args=body.get("args", ""),
            disk=body.get("disk", DEFAULT_DISK_GB),
            ports=list(body.get("ports", [])),
            env=dict(body.get("env", {})),
            registry=body.get("registry"),
            mounts=mounts,
            gpu=gpu,
            cloud=cloud,
            data_centre=centre,
            cuda=self._cuda(offer, body["gpu"]),
            template=body.get("templateId"),
            price=round(price * gpu["count"], 4),
            public_ip=cloud != "COMMUNITY" or self.knobs.community_public_ip,
            created_at=_now(),
            since=self.clock(),
            global_networking=bool(body.get("globalNetworking", False)),
        )
        self.pods[pod.id] = pod
        pod.log("system", f"pod {pod.id} created on {gpu['count']} x {gpu['id']} in {centre}")
        if self.knobs.fail_after_create > 0:
            self.knobs.fail_after_create -= 1
            raise Problem(500, "internal error")
        return Reply(201, self.pod_view(pod))

    def _with_template(self, body: dict[str, Any]) -> dict[str, Any]:
        """The body with its template's settings under it (the body's win; env merges)."""
        template_id = body.get("templateId")
        if template_id is None:
            return body
        template = self.templates.get(template_id)
        if template is None:
            raise Problem(404, f"template {template_id} not found")
        merged = {k: template[k] for k in ("image", "args", "disk", "ports", "registry")}
        merged.update({k: v for k, v in body.items() if k != "env"})
        merged["env"] = {**template["env"], **body.get("env", {})}
        persistent = template["mounts"].get("persistent")
        if persistent is not None and "persistent" not in body.get("mounts", {}):
            merged["mounts"] = {**body.get("mounts", {}), "persistent": persistent}
        return merged

    def _offer(self, gpu_id: str, count: int) -> GpuOffer:
        offer = self.gpus.get(gpu_id)
        if offer is None:
            raise Problem(400, f"GPU type {gpu_id!r} is not in the catalog")
        if count > offer.max_count:
            raise Problem(400, f"{gpu_id} pods take at most {offer.max_count} GPUs")
        return offer

    def in_stock(self, gpu_id: str, cloud: str | None) -> bool:
        """Whether pods of ``gpu_id`` can be placed in ``cloud`` (None: in either)."""
        clouds = [cloud] if cloud else ["SECURE", "COMMUNITY"]
        return any(not {(gpu_id, c), (gpu_id, "*")} & self.knobs.no_stock for c in clouds)

    def _place(self, offer: GpuOffer, cloud: str, wanted: list[str], mounts: dict[str, Any]) -> str:
        """The data centre the pod runs in: its network volume's, else the first wanted
        (or any) one offering the GPU; 400 with RunPod's no-capacity words if none."""
        unknown = [c for c in wanted if c not in self.data_centres]
        if unknown:
            raise Problem(400, f"unknown data center {unknown[0]}")
        candidates = wanted or list(offer.data_centres)
        for mount in mounts.get("network", []):
            volume = self.volumes.get(mount["volumeId"])
            if volume is None:
                raise Problem(404, f"network volume {mount['volumeId']} not found")
            if volume["dataCenter"] not in candidates:
                raise Problem(
                    400,
                    f"network volume {volume['id']} is in {volume['dataCenter']}, "
                    f"not in dataCenterIds {wanted}",
                )
            candidates = [volume["dataCenter"]]
        placed = [c for c in candidates if c in offer.data_centres]
        if not placed or not self.in_stock(offer.id, cloud):
            raise Problem(400, NO_CAPACITY)
        return placed[0]

    def _cuda(self, offer: GpuOffer, gpu: dict[str, Any]) -> str:
        allowed = gpu.get("allowedCudaVersions") or []
        floor = gpu.get("minCudaVersion")
        if allowed and floor is not None:
            raise Problem(400, "give allowedCudaVersions or minCudaVersion, not both")
        fits = [
            v
            for v in offer.cuda_versions
            if (not allowed or v in allowed) and (floor is None or _cuda_key(v) >= _cuda_key(floor))
        ]
        if not fits:
            raise Problem(400, NO_CAPACITY)
        return max(fits, key=_cuda_key)

    def _patch_pod(self, call: Call) -> Reply:
        pod = self._pod(call)
        body = self._with_template(dict(call.body)) if "templateId" in call.body else call.body
        for key in (
            "name",
            "image",
            "args",
            "disk",
            "ports",
            "env",
            "registry",
            "mounts",
            "locked",
        ):
            if key in body:
                setattr(pod, key, body[key])
        if "globalNetworking" in body:
            pod.global_networking = bool(body["globalNetworking"])
        return Reply(200, self._shown(pod, call.stops))

    def _delete_pod(self, call: Call) -> Reply:
        self._terminate(self._pod(call), call.stops)
        return Reply(204, None, media=None)

    def _terminate(self, pod: PodRecord, stops: list[Callable[[], None]]) -> None:
        self._stop_process(pod, stops)
        pod.status = "TERMINATED"
        self.pods.pop(pod.id, None)

    def _pod_action(self, call: Call) -> Reply:
        pod = self._pod(call)
        self._advance(pod, call.stops)
        action = call.body["action"]
        if action not in ACTIONS[pod.status]:
            raise Problem(409, f"cannot {action} a pod that is {pod.status}")
        if pod.locked and action in ("stop", "restart"):
            raise Problem(409, f"pod {pod.id} is locked")
        if action == "terminate":
            self._terminate(pod, call.stops)
            return Reply(204, None, media=None)
        self._stop_process(pod, call.stops)
        if action == "stop":
            self._enter(pod, "EXITED")
            pod.log("system", "pod stopped")
        else:
            self._start(pod)
        return Reply(200, self.pod_view(pod))

    def _logs(self, call: Call) -> Reply:
        self._pod(call)
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return Reply(200, "", headers, media=EVENTS)

    # -- the pod lifecycle ------------------------------------------------------------

    def _enter(self, pod: PodRecord, status: str) -> None:
        pod.status, pod.since = status, self.clock()
        if status != "RUNNING":
            pod.mapping = {}

    def _start(self, pod: PodRecord) -> None:
        """``STARTING``: the next boot error, if the test queued one, else a launch."""
        self._enter(pod, "STARTING")
        pod.launch_error = None
        pod.boot_error = self.knobs.boot_errors.pop(0) if self.knobs.boot_errors else None
        pod.log("system", "starting container")
        if pod.boot_error is None and self.launcher is not None:
            self._launch(pod, self.launcher)

    def _advance(self, pod: PodRecord, stops: list[Callable[[], None]]) -> None:
        """Move the pod along its lifecycle as far as the clock (and its launch) allow."""
        now = self.clock()
        if pod.status == "PROVISIONING" and now - pod.since >= self.knobs.provision_s:
            self._start(pod)
        if pod.status != "STARTING" or now - pod.since < self.knobs.start_s:
            return
        reason = pod.boot_error or pod.launch_error
        if reason is not None:
            self._stop_process(pod, stops)
            self._enter(pod, "ERROR")
            pod.log("system", reason)
        elif self.launcher is None:
            self._running(pod, "127.0.0.1", {p: free_port() for p in pod.tcp_ports()})
        elif pod.launched is not None:
            self._running(pod, pod.launched[0], pod.launched[1])

    def _running(self, pod: PodRecord, ip: str, ports: Mapping[int, int]) -> None:
        self._enter(pod, "RUNNING")
        pod.started_at = _now()
        pod.mapping = {
            p: (ip, ports.get(p)) if pod.public_ip else (None, None) for p in pod.tcp_ports()
        }
        pod.log("system", "container started")

    def _launch(self, pod: PodRecord, launcher: Launcher) -> None:
        """Run ``launcher`` for the pod in a thread; a launch the pod no longer waits for
        (stopped, restarted, terminated meanwhile) is stopped at once."""
        pod.generation += 1
        generation, view = pod.generation, self.pod_view(pod)

        def run() -> None:
            try:
                ip, ports, stop = launcher(view)
            except Exception as exc:  # the container failed to start
                with self._lock:
                    if pod.generation == generation:
                        pod.launch_error = f"container failed to start: {exc}"
                return
            first = pod.tcp_ports()[:1]
            mapping = dict(ports) if isinstance(ports, Mapping) else {p: ports for p in first}
            with self._lock:
                wanted = pod.generation == generation and self.pods.get(pod.id) is pod
                if wanted:
                    pod.launched = (ip, mapping, stop)
            if not wanted:
                stop()

        threading.Thread(target=run, daemon=True, name=f"pod {pod.id}").start()

    def _stop_process(self, pod: PodRecord, stops: list[Callable[[], None]]) -> None:
        """Forget the pod's process (and any launch in flight); ``stops`` gets its stop."""
        pod.generation += 1
        if pod.launched is not None:
            stops.append(pod.launched[2])
            pod.launched = None

    def _shown(self, pod: PodRecord, stops: list[Callable[[], None]]) -> dict[str, Any]:
        self._advance(pod, stops)
        return self.pod_view(pod)

    def pod_view(self, pod: PodRecord) -> dict[str, Any]:
        """The pod as RunPod's ``Pod`` schema shapes it (no lifecycle step taken)."""
        running = pod.status == "RUNNING"
        return {
            "id": pod.id,
            "name": pod.name,
            "image": pod.image,
            "args": pod.args,
            "disk": pod.disk,
            "ports": list(pod.ports),
            "env": dict(pod.env),
            "registry": pod.registry,
            "status": pod.status,
            "actions": list(ACTIONS[pod.status]),
            "mounts": pod.mounts,
            "gpu": dict(pod.gpu),
            "cloud": pod.cloud,
            "dataCenterId": pod.data_centre,
            "cudaVersion": pod.cuda,
            "ssh": {"proxy": None, "direct": None},
            "template": pod.template,
            "cost": 0.0 if pod.status in ("EXITED", "TERMINATED") else pod.price,
            "locked": pod.locked,
            "globalNetworking": {"enabled": pod.global_networking},
            "runtime": self._runtime(pod) if running else None,
            "createdAt": pod.created_at,
            "startedAt": pod.started_at,
        }

    def _runtime(self, pod: PodRecord) -> dict[str, Any]:
        ports = [
            {"private": p, "public": public, "type": "tcp", "ip": ip}
            for p, (ip, public) in sorted(pod.mapping.items())
        ]
        gpus = [{"util": 0, "memoryUtil": 0} for _ in range(pod.gpu["count"])]
        return {"uptime": int(self.clock() - pod.since), "ports": ports, "gpus": gpus}

    # -- the catalog ----------------------------------------------------------------

    def _catalog_gpus(self, call: Call) -> Reply:
        include, products = call.csv("include"), call.csv("product")
        if bool(include) != bool(products):
            raise Problem(
                400, "product is required with include=AVAILABILITY, and valid only with it"
            )
        if "count" in call.query and not include:
            raise Problem(400, "count is valid only with include=AVAILABILITY")
        countries = call.csv("countryCodes")
        out = []
        for offer in self.gpus.values():
            centres = [
                c
                for c in offer.data_centres
                if not countries or self.data_centres[c].country in countries
            ]
            if not centres:
                continue
            item = self._gpu_type(offer)
            if include:
                item.update(self._availability(offer, products, centres, call))
            out.append(item)
        return Reply(200, {"gpus": out})

    def _gpu_type(self, offer: GpuOffer) -> dict[str, Any]:
        price: dict[str, Any] = {"secure": offer.secure, "community": offer.community}
        if offer.serverless is not None:
            price["serverless"] = offer.serverless
        return {
            "id": offer.id,
            "name": offer.name,
            "pool": offer.pool,
            "manufacturer": "NVIDIA",
            "memory": offer.memory_gb,
            "secure": True,
            "community": True,
            "price": price,
            "maxCount": {"secure": offer.max_count, "community": offer.max_count},
        }

    def _availability(
        self, offer: GpuOffer, products: list[str], centres: list[str], call: Call
    ) -> dict[str, Any]:
        count = int(call.query["count"][-1]) if "count" in call.query else 1
        cloud = call.query["cloud"][-1] if "cloud" in call.query else None
        pods = self.in_stock(offer.id, cloud) and count <= offer.max_count
        stocked = any(pods if p == "POD" else True for p in products)
        level = "HIGH" if stocked else "NONE"
        out: dict[str, Any] = {"availability": level}
        if stocked:
            out["dataCenters"] = [
                {"id": c, "name": self.data_centres[c].name, "availability": level} for c in centres
            ]
        wanted, floor = call.csv("cudaVersions"), call.query.get("minCudaVersion", [None])[-1]
        out["cudaVersions"] = [
            {"version": v, "available": stocked}
            for v in offer.cuda_versions
            if (not wanted or v in wanted) and (floor is None or _cuda_key(v) >= _cuda_key(floor))
        ]
        return out

    def _catalog_data_centres(self, call: Call) -> Reply:
        include, regions = call.csv("include"), call.csv("regions")
        types, compliance = call.csv("networkVolumeTypes"), call.csv("compliance")
        global_network = call.flag("globalNetwork")
        out = []
        for dc in self.data_centres.values():
            if (regions and dc.region not in regions) or compliance:
                continue  # no data centre here claims a compliance
            if types and not set(types) & set(dc.volume_types):
                continue
            if global_network is not None and dc.global_network != global_network:
                continue
            out.append(self._data_centre(dc, include))
        return Reply(200, {"dataCenters": out})

    def _data_centre(self, dc: DataCentre, include: list[str]) -> dict[str, Any]:
        item: dict[str, Any] = {
            "id": dc.id,
            "name": dc.name,
            "region": dc.region,
            "globalNetwork": dc.global_network,
            "networkVolumeTypes": list(dc.volume_types),
            "compliance": [],
        }
        if "GPU_AVAILABILITY" in include:
            item["gpuAvailability"] = [
                {
                    "id": g.id,
                    "name": g.name,
                    "availability": "HIGH" if self.in_stock(g.id, None) else "NONE",
                }
                for g in self.gpus.values()
                if dc.id in g.data_centres
            ]
        if "CPU_AVAILABILITY" in include:
            item["cpuAvailability"] = []
        return item

    # -- network volumes and templates ------------------------------------------------

    def _list_volumes(self, call: Call) -> Reply:
        return Reply(200, {"networkVolumes": list(self.volumes.values())})

    def _create_volume(self, call: Call) -> Reply:
        body = call.body
        dc = self.data_centres.get(body["dataCenter"])
        if dc is None:
            raise Problem(400, f"unknown data center {body['dataCenter']}")
        kind = body.get("type", "STANDARD")
        if kind not in dc.volume_types:
            raise Problem(400, f"{dc.id} offers no {kind} network volumes")
        volume = {
            "id": _new_id(),
            "name": body["name"],
            "size": body["size"],
            "dataCenter": dc.id,
            "type": kind,
        }
        self.volumes[volume["id"]] = volume
        return Reply(201, volume)

    def _volume(self, call: Call) -> dict[str, Any]:
        volume = self.volumes.get(call.params["id"])
        if volume is None:
            raise Problem(404, "network volume not found")
        return volume

    def _get_volume(self, call: Call) -> Reply:
        return Reply(200, self._volume(call))

    def _delete_volume(self, call: Call) -> Reply:
        self.volumes.pop(self._volume(call)["id"])
        return Reply(204, None, media=None)

    def _list_templates(self, call: Call) -> Reply:
        return Reply(200, {"templates": list(self.templates.values())})

    def _create_template(self, call: Call) -> Reply:
        template: dict[str, Any] = {
            "id": _new_id(),
            "args": "",
            "disk": DEFAULT_DISK_GB,
            "mounts": {},
            "ports": [],
            "env": {},
            "registry": None,
            "serverless": False,
            "public": False,
            "category": "NVIDIA",
            "startSsh": True,
            "startJupyter": True,
            "allowedCudaVersions": [],
        }
        template.update(call.body)
        self.templates[template["id"]] = template
        return Reply(201, template)

    def _get_template(self, call: Call) -> Reply:
        template = self.templates.get(call.params["id"])
        if template is None:
            raise Problem(404, "template not found")
        return Reply(200, template)

    # -- serverless endpoints ---------------------------------------------------------

    def _list_endpoints(self, call: Call) -> Reply:
        return Reply(200, {"endpoints": list(self.endpoints.values())})

    def _endpoint(self, call: Call) -> dict[str, Any]:
        endpoint = self.endpoints.get(call.params["id"])
        if endpoint is None:
            raise Problem(404, "endpoint not found")
        return endpoint

    def _get_endpoint(self, call: Call) -> Reply:
        return Reply(200, self._endpoint(call))

    def _create_endpoint(self, call: Call) -> Reply:
        body = self._with_template(dict(call.body))
        if ("gpu" in body) == ("cpu" in body):
            raise Problem(400, "give exactly one of gpu or cpu")
        if "cpu" in body:
            raise Problem(400, "CPU endpoints are not played by this contract server")
        endpoint_id = _new_id()
        endpoint: dict[str, Any] = {
            "id": endpoint_id,
            "type": "QUEUE",
            "args": "",
            "ports": [],
            "env": {},
            "registry": None,
            "dataCenterIds": [],
            "networkVolumes": [],
            "timeout": 300000,
            "flashboot": "OFF",
            "createdAt": _now(),
        }
        skip = ("gpu", "workers", "templateId", "mounts")
        endpoint.update({k: v for k, v in body.items() if k not in skip})
        endpoint["gpu"] = self._endpoint_gpu({}, body["gpu"])
        endpoint["workers"] = {"min": 0, "max": 3, "idleTimeout": 10, **body.get("workers", {})}
        endpoint["requestUrls"] = self._request_urls(endpoint_id, endpoint["type"])
        self.endpoints[endpoint_id] = endpoint
        return Reply(201, endpoint)

    def _endpoint_gpu(self, current: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
        gpu = {"count": 1, "allowedCudaVersions": [], "minCudaVersion": None, **current, **given}
        if gpu["allowedCudaVersions"] and gpu["minCudaVersion"]:
            raise Problem(400, "give allowedCudaVersions or minCudaVersion, not both")
        pools = {g.pool for g in self.gpus.values()}
        unknown = [p for p in gpu.get("pools", []) if p not in pools]
        if unknown:
            raise Problem(400, f"unknown GPU pool {unknown[0]}")
        gpu["minCudaVersion"] = gpu["minCudaVersion"] or None
        return gpu

    def _request_urls(self, endpoint_id: str, kind: str) -> dict[str, str]:
        base = f"{self.knobs.serverless_url.rstrip('/')}/{endpoint_id}"
        if kind == "LOAD_BALANCER":
            return {"base": base, "health": f"{base}/ping"}
        names = {
            "run": "run",
            "runSync": "runsync",
            "status": "status",
            "stream": "stream",
            "cancel": "cancel",
            "retry": "retry",
            "purgeQueue": "purge-queue",
            "health": "health",
        }
        return {key: f"{base}/{path}" for key, path in names.items()}

    def _patch_endpoint(self, call: Call) -> Reply:
        endpoint = self._endpoint(call)
        body = self._with_template(dict(call.body)) if "templateId" in call.body else call.body
        if "cpu" in body:
            raise Problem(400, "cpu on a GPU endpoint: the compute family is immutable")
        for key, value in body.items():
            if key == "gpu":
                endpoint["gpu"] = self._endpoint_gpu(endpoint["gpu"], value)
            elif key == "workers":
                endpoint["workers"] = {**endpoint["workers"], **value}
            elif key != "templateId":
                endpoint[key] = value
        return Reply(200, endpoint)

    def _delete_endpoint(self, call: Call) -> Reply:
        self.endpoints.pop(self._endpoint(call)["id"])
        return Reply(204, None, media=None)

    # -- the log stream ----------------------------------------------------------------

    async def events(
        self, exchange: Exchange, query: dict[str, list[str]], last_id: str | None
    ) -> AsyncIterator[bytes]:
        """The pod's log as Server-Sent Events, held open until the pod is gone or the
        server closes (as RunPod's stream stays open); each event checked as a string."""
        pod_id = self.schema.path_params(LOGS, exchange.path)["id"]
        sources = {query["source"][-1]} if "source" in query else {"container", "system"}
        tail = int(query["tail"][-1]) if "tail" in query else 100
        sent = self._first_event(pod_id, tail, last_id)
        while not self.closing:
            stops: list[Callable[[], None]] = []
            new: list[tuple[str, str, str]] = []
            with self._lock:
                pod = self.pods.get(pod_id)
                if pod is not None:
                    self._advance(pod, stops)
                    new, sent = pod.logs[sent:], len(pod.logs)
            if stops:
                await run_in_threadpool(_run, stops)
            if pod is None:
                return
            for event_id, source, line in new:
                if source in sources:
                    yield self._event(exchange, event_id, source, line)
            await asyncio.sleep(LOG_POLL_S)

    def _first_event(self, pod_id: str, tail: int, last_id: str | None) -> int:
        with self._lock:
            logs = self.pods[pod_id].logs if pod_id in self.pods else []
            ids = [event_id for event_id, _, _ in logs]
        if last_id in ids:
            return ids.index(last_id) + 1
        return max(0, len(ids) - tail)

    def _event(self, exchange: Exchange, event_id: str, source: str, line: str) -> bytes:
        data = json.dumps({"ts": event_id.split("/")[0], "source": source, "line": line})
        text = f"id: {event_id}\ndata: {data}\n\n"
        errors = self.schema.check_response("GET", LOGS, 200, text, EVENTS)
        exchange.response_errors += errors
        return text.encode()


def _run(stops: list[Callable[[], None]]) -> None:
    for stop in stops:
        stop()


def _problem(problem: Problem) -> Reply:
    headers = {} if problem.retry_after is None else {"Retry-After": str(problem.retry_after)}
    return Reply(problem.status, problem.body(), headers, media=PROBLEM)


def create_app(server: ContractServer) -> Starlette:
    """Every path and method goes to :meth:`ContractServer.handle` (in a thread: a
    pod's process may take a while to stop)."""

    async def endpoint(request: Request) -> Response:
        query: dict[str, list[str]] = {}
        for name, value in request.query_params.multi_items():
            query.setdefault(name, []).append(value)
        if server.api_key in str(request.url):
            server.key_in_url = True
        raw = await request.body()
        reply, exchange = await run_in_threadpool(
            server.handle, request.method, request.url.path, query, dict(request.headers), raw
        )
        if reply.media == EVENTS and reply.status == 200:
            events = server.events(exchange, query, request.headers.get("last-event-id"))
            return StreamingResponse(events, media_type=EVENTS, headers=reply.headers)
        if reply.body is None:
            return Response(status_code=reply.status, headers=reply.headers)
        content = json.dumps(reply.body)
        return Response(content, reply.status, reply.headers, media_type=reply.media)

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    return Starlette(routes=[Route("/{path:path}", endpoint, methods=methods)])


@contextmanager
def running_runpod_v2(server: ContractServer) -> Iterator[str]:
    """Serve ``server`` on 127.0.0.1 (a free port) in a thread; yields the API's base URL
    (``http://127.0.0.1:<port>/v2``). On exit every pod's process is stopped."""
    try:
        with serve_in_thread(create_app(server), "RunPod v2 contract server") as port:
            try:
                yield f"http://127.0.0.1:{port}/v2"
            finally:
                server.closing = True
    finally:
        server.close()
