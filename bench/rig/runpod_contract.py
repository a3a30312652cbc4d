"""A contract server for the RunPod REST API v1, for tests and the fleet bench.

It follows the documented API (``POST /pods``, ``POST /templates``,
``POST /networkvolumes``, ``GET /networkvolumes/{id}``,
``GET /templates[/{id}]``, ``GET /pods``,
``GET /pods/{id}``, ``POST /pods/{id}/stop|start``, ``DELETE /pods/{id}``;
Bearer key; pod fields ``desiredStatus``, ``costPerHr`` (a string, as the docs
show), ``adjustedCostPerHr``, ``publicIp``, ``portMappings``, ``gpu`` with its
prices, ``interruptible``) and refuses what the API would (bad key, unknown
body fields, missing ones). Faults are injected by the test: 500s, 429s, "no
capacity" per GPU type, slow provisioning, a spot pod vanishing (preempted).

A ``launcher`` may back each pod with a real process (a local worker, or one per
GPU for a multi-GPU pod): the pod's ``portMappings`` then point at it, as on RunPod.
A pod made from a template (``templateId``) gets the template's image, ports, start
command and disk unless the body gives them, and the template's env with the body's
on top. A pod's ``networkVolumeId`` must name a volume made here, and its data centre
must be among the body's ``dataCenterIds`` when it gives any (a network volume lives in
one data centre); the pod records the volume, its ``volumeMountPath`` and the data
centre it runs in.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

NO_CAPACITY = (
    "There are no longer any instances available with the requested specifications. "
    "Please refresh and try again."
)
PRICES: dict[str, tuple[float, float, float, float]] = {
    # illustrative prices: secure, community, secure spot, community spot ($/GPU/h)
    "NVIDIA RTX A4000": (0.32, 0.20, 0.13, 0.10),
    "NVIDIA RTX A5000": (0.36, 0.26, 0.16, 0.12),
    "NVIDIA L4": (0.43, 0.30, 0.20, 0.16),
}


class CreateTemplate(BaseModel):
    """The documented ``POST /templates`` body fields this contract accepts."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=191)
    imageName: str = Field(min_length=1)
    category: Literal["NVIDIA", "AMD", "CPU"] = "NVIDIA"
    containerDiskInGb: int = Field(50, ge=1)
    containerRegistryAuthId: str | None = None
    dockerEntrypoint: list[str] = Field(default_factory=list)
    dockerStartCmd: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    isPublic: bool = False
    isServerless: bool = False
    ports: list[str] = Field(default_factory=list)
    readme: str = ""
    volumeInGb: int = Field(20, ge=0)
    volumeMountPath: str = "/workspace"


class CreatePod(BaseModel):
    """The documented ``POST /pods`` body fields this contract accepts. A pod names its
    image, or a template (``templateId``) that supplies it; what the body gives is used
    over the template's, and its env is added to the template's."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=191)
    imageName: str | None = Field(None, min_length=1)
    templateId: str | None = Field(None, min_length=1)
    dockerStartCmd: list[str] | None = None
    dockerEntrypoint: list[str] | None = None
    gpuTypeIds: list[str] = Field(min_length=1)
    gpuTypePriority: Literal["availability", "custom"] = "availability"
    gpuCount: int = Field(1, ge=1, le=8)
    cloudType: Literal["SECURE", "COMMUNITY"] = "SECURE"
    interruptible: bool = False
    ports: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    networkVolumeId: str | None = None
    volumeMountPath: str = Field("/workspace", pattern=r"^/")
    dataCenterIds: list[str] | None = None
    containerDiskInGb: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _image_or_template(self) -> CreatePod:
        if self.imageName is None and self.templateId is None:
            raise ValueError("give imageName or templateId")
        return self


class CreateNetworkVolume(BaseModel):
    """The documented ``POST /networkvolumes`` body: a volume lives in one data centre."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=255)
    size: int = Field(ge=1, le=4000, description="GB")
    dataCenterId: str = Field(min_length=1)


Launcher = Callable[[dict[str, Any]], tuple[str, int | dict[str, int], Callable[[], None]]]
"""pod -> (public ip, public port of the first tcp port or {container port: public port},
stop function)."""


@dataclass
class Faults:
    fail_next: int = 0
    """Answer the next N requests with HTTP 500."""
    rate_limit_next: int = 0
    """Answer the next N requests with HTTP 429 (Retry-After: 0.05)."""
    no_capacity: set[tuple[str, str]] = field(default_factory=set)
    """(gpu type, cloud type) with no capacity; cloud '*' = every cloud."""
    provision_s: float = 0.0
    """Seconds before a new pod gets its public IP and port mappings."""
    on_create: Callable[[dict[str, Any]], None] | None = None
    """Called after a pod is recorded, before the response goes out."""


class ContractState:
    def __init__(self, api_key: str, clock: Callable[[], float] = time.time) -> None:
        self.api_key = api_key
        self.clock = clock
        self.pods: dict[str, dict[str, Any]] = {}
        self.templates: dict[str, dict[str, Any]] = {}
        self.volumes: dict[str, dict[str, Any]] = {}
        self.faults = Faults()
        self.launcher: Launcher | None = None
        self.requests: list[tuple[str, str]] = []
        self.key_in_url = False
        self._stops: dict[str, Callable[[], None]] = {}
        self._lock = threading.Lock()

    def _gpu(self, gpu_type: str, count: int) -> dict[str, Any]:
        s, c, ss, cs = PRICES.get(gpu_type, (0.5, 0.4, 0.25, 0.2))
        return {
            "id": gpu_type, "count": count, "displayName": gpu_type.removeprefix("NVIDIA "),
            "securePrice": s, "communityPrice": c, "secureSpotPrice": ss, "communitySpotPrice": cs,
        }  # fmt: skip

    def add_template(self, body: CreateTemplate) -> dict[str, Any]:
        template = {"id": secrets.token_hex(5), **body.model_dump()}
        self.templates[template["id"]] = template
        return template

    def add_volume(self, body: CreateNetworkVolume) -> dict[str, Any]:
        volume = {"id": secrets.token_hex(5), **body.model_dump()}
        self.volumes[volume["id"]] = volume
        return volume

    def volume_problem(self, body: CreatePod) -> str | None:
        """Why RunPod would refuse the pod's network volume (None: it would not)."""
        if body.networkVolumeId is None:
            return None
        volume = self.volumes.get(body.networkVolumeId)
        if volume is None:
            return f"network volume {body.networkVolumeId} not found"
        if body.dataCenterIds and volume["dataCenterId"] not in body.dataCenterIds:
            return (f"network volume {volume['id']} is in {volume['dataCenterId']}, not in "
                    f"dataCenterIds {body.dataCenterIds}")  # fmt: skip
        return None

    def _gpu_type(self, body: CreatePod) -> str | None:
        for gpu in body.gpuTypeIds:
            if not {(gpu, body.cloudType), (gpu, "*")} & self.faults.no_capacity:
                return gpu
        return None

    def create(self, body: CreatePod) -> dict[str, Any] | None:
        """The new pod, or None when no GPU type has capacity (``body.templateId`` must
        name a template: :meth:`add_template`)."""
        gpu_type = self._gpu_type(body)
        if gpu_type is None:
            return None
        t = self.templates[body.templateId] if body.templateId else {}
        g = self._gpu(gpu_type, body.gpuCount)
        key = ("community" if body.cloudType == "COMMUNITY" else "secure") + (
            "SpotPrice" if body.interruptible else "Price"
        )
        price = round(float(g[key]) * body.gpuCount, 4)
        pod: dict[str, Any] = {
            "id": secrets.token_hex(7), "name": body.name,
            "image": body.imageName or t["imageName"], "templateId": body.templateId,
            "desiredStatus": "RUNNING", "costPerHr": f"{price}", "adjustedCostPerHr": price,
            "interruptible": body.interruptible, "gpuCount": body.gpuCount, "gpu": g,
            "machine": {"gpuTypeId": gpu_type}, "ports": body.ports or t.get("ports", []),
            "env": {**t.get("env", {}), **body.env},
            "dockerStartCmd": body.dockerStartCmd or t.get("dockerStartCmd", []),
            "containerDiskInGb": body.containerDiskInGb or t.get("containerDiskInGb", 50),
            "networkVolumeId": body.networkVolumeId, "publicIp": None, "portMappings": None,
            "volumeMountPath": body.volumeMountPath if body.networkVolumeId else None,
            "dataCenterId": self._data_center(body),
            "_created": self.clock(), "_cloud": body.cloudType,
        }  # fmt: skip
        with self._lock:
            self.pods[pod["id"]] = pod
        return pod

    def _data_center(self, body: CreatePod) -> str:
        volume = self.volumes.get(body.networkVolumeId or "")
        if volume is not None:  # a pod with a network volume runs in its data centre
            return str(volume["dataCenterId"])
        return (body.dataCenterIds or ["EU-RO-1"])[0]

    def view(self, pod: dict[str, Any]) -> dict[str, Any]:
        if pod["publicIp"] is None and self.clock() - pod["_created"] >= self.faults.provision_s:
            self._provision(pod)
        return {k: v for k, v in pod.items() if not k.startswith("_")}

    def _provision(self, pod: dict[str, Any]) -> None:
        tcp = [p for p in pod["ports"] if p.endswith("/tcp")]
        if self.launcher is None:
            pod["publicIp"] = "127.0.0.1"
            pod["portMappings"] = {p.split("/")[0]: 1 for p in tcp}  # nothing listens there
            return
        if "_launching" in pod:
            return
        pod["_launching"] = True
        launcher = self.launcher

        def launch() -> None:  # the container "boots" in the background
            ip, ports, stop = launcher(pod)
            if pod["id"] not in self.pods:
                stop()
                return
            self._stops[pod["id"]] = stop
            if isinstance(ports, int):
                ports = {p.split("/")[0]: ports for p in tcp[:1]}
            pod["publicIp"], pod["portMappings"] = ip, ports

        threading.Thread(target=launch, daemon=True).start()

    def remove(self, pod_id: str) -> bool:
        with self._lock:
            pod = self.pods.pop(pod_id, None)
        stop = self._stops.pop(pod_id, None)
        if stop is not None:
            stop()
        return pod is not None

    def preempt(self, pod_id: str, *, vanish: bool = True) -> None:
        """A spot pod is taken back: it disappears (or turns EXITED)."""
        if vanish:
            self.remove(pod_id)
            return
        stop = self._stops.pop(pod_id, None)
        if stop is not None:
            stop()
        self.pods[pod_id]["desiredStatus"] = "EXITED"

    def by_name(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for pod in list(self.pods.values()):
            out.setdefault(pod["name"], []).append(pod["id"])
        return out


def create_app(state: ContractState) -> FastAPI:  # noqa: C901 - one route table
    app = FastAPI(title="RunPod REST API v1 (contract)")

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Any:
        state.requests.append((request.method, request.url.path))
        if state.api_key in str(request.url):
            state.key_in_url = True
        if request.headers.get("Authorization") != f"Bearer {state.api_key}":
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        if state.faults.fail_next > 0:
            state.faults.fail_next -= 1
            return JSONResponse({"error": "internal server error"}, status_code=500)
        if state.faults.rate_limit_next > 0:
            state.faults.rate_limit_next -= 1
            return JSONResponse(
                {"error": "rate limited"}, status_code=429, headers={"Retry-After": "0.05"}
            )
        return await call_next(request)

    @app.post("/v1/templates", status_code=200)
    async def create_template(body: CreateTemplate) -> Any:
        return state.add_template(body)

    @app.get("/v1/templates")
    async def list_templates() -> list[dict[str, Any]]:
        return list(state.templates.values())

    @app.get("/v1/templates/{template_id}")
    async def get_template(template_id: str) -> Any:
        template = state.templates.get(template_id)
        if template is None:
            return JSONResponse({"error": "template not found"}, status_code=404)
        return template

    @app.post("/v1/networkvolumes", status_code=200)
    async def create_volume(body: CreateNetworkVolume) -> Any:
        return state.add_volume(body)

    @app.get("/v1/networkvolumes/{volume_id}")
    async def get_volume(volume_id: str) -> Any:
        volume = state.volumes.get(volume_id)
        if volume is None:
            return JSONResponse({"error": "network volume not found"}, status_code=404)
        return volume

    @app.post("/v1/pods", status_code=201)
    async def create(body: CreatePod) -> Any:
        if body.templateId is not None and body.templateId not in state.templates:
            return JSONResponse({"error": f"template {body.templateId} not found"}, status_code=400)
        problem = state.volume_problem(body)
        if problem is not None:
            return JSONResponse({"error": problem}, status_code=400)
        pod = state.create(body)
        if pod is None:
            return JSONResponse({"error": f"create pod: {NO_CAPACITY}"}, status_code=500)
        if state.faults.on_create is not None:
            state.faults.on_create(pod)
        return state.view(pod)

    @app.get("/v1/pods")
    async def list_pods() -> list[dict[str, Any]]:
        return [state.view(p) for p in list(state.pods.values())]

    @app.get("/v1/pods/{pod_id}")
    async def get_pod(pod_id: str) -> Any:
        pod = state.pods.get(pod_id)
        if pod is None:
            return JSONResponse({"error": "pod not found"}, status_code=404)
        return state.view(pod)

    @app.post("/v1/pods/{pod_id}/stop")
    async def stop_pod(pod_id: str) -> Any:
        pod = state.pods.get(pod_id)
        if pod is None:
            return JSONResponse({"error": "pod not found"}, status_code=404)
        pod["desiredStatus"] = "EXITED"
        return state.view(pod)

    @app.post("/v1/pods/{pod_id}/start")
    async def start_pod(pod_id: str) -> Any:
        pod = state.pods.get(pod_id)
        if pod is None:
            return JSONResponse({"error": "pod not found"}, status_code=404)
        pod["desiredStatus"] = "RUNNING"
        return state.view(pod)

    @app.delete("/v1/pods/{pod_id}")
    async def delete_pod(pod_id: str) -> Any:
        if not state.remove(pod_id):
            return JSONResponse({"error": "pod not found"}, status_code=404)
        return {}

    return app


@contextmanager
def serve_in_thread(app: FastAPI, what: str) -> Iterator[int]:
    """Serve ``app`` on 127.0.0.1 (a free port) in a thread; yields the port."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.01)
    try:
        yield int(server.servers[0].sockets[0].getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(10)


@contextmanager
def running_contract_server(state: ContractState) -> Iterator[str]:
    """Serve on 127.0.0.1 (free port) in a thread; yields the base URL (.../v1)."""
    with serve_in_thread(create_app(state), "contract server") as port:
        yield f"http://127.0.0.1:{port}/v1"
