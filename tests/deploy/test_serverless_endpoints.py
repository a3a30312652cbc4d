"""Serverless endpoints the orchestrator manages (issue 29, part 6), against the RunPod
API v2 contract server: every request and answer checked against RunPod's schema.

A tier's endpoint (``<fleet>-<tier>``) is created once from the worker image, queue-based,
workers from 0; a second reconcile or a restarted orchestrator takes it as it is; a
change of settings is one PATCH of the changed fields alone; an answer lost after the
create never makes a second one; the request URLs are RunPod's answer's, not built
from the id; a job on the tier carries them to its tasks.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from bench.rig.runpod_v2_contract import (
    GPUS,
    Call,
    ContractServer,
    GpuOffer,
    Problem,
    Reply,
    running_runpod_v2,
)
from deploy.jobs import JobRecord, TaskRecord, task_spec
from deploy.providers.base import ProviderError
from deploy.providers.runpod.endpoints import (
    SERVERLESS_VOLUME,
    WORKER_ARGS,
    ServerlessEndpoints,
    gpu_choice,
    patch_body,
    request_urls,
)
from deploy.serverless_jobs import NoServerlessTier, choose
from deploy.service import make_endpoints
from deploy.settings import (
    VOLUME_ENV,
    OrchestratorSettings,
    RunPodSettings,
    ServerlessConfig,
    TierConfig,
    TierVolume,
)
from framerelay.errors import ConfigError
from framerelay.jobs import JobSpec
from tests.support.auth import ed_keys
from tests.support.runpod import api_post

KEY = "rpa_" + "Endp01ntK3y" * 3
SERVERLESS_URL = "https://api.runpod.ai/v2"
ADA = GpuOffer("NVIDIA RTX 4000 Ada Generation", "RTX 4000 Ada", 20, 0.38, 0.26, "ADA_24", 0.6)
WORKER_ENV = {"FRAMERELAY_WORKER_TUNNEL_KEYS": '{"keys": []}'}


class LosingCreates(ContractServer):
    """Makes the endpoint, then answers 500 for the next ``lose`` creates."""

    lose = 0

    def _create_endpoint(self, call: Call) -> Reply:
        reply = super()._create_endpoint(call)
        if self.lose > 0:
            self.lose -= 1
            raise Problem(500, "internal error")
        return reply


@pytest.fixture
def server() -> Iterator[ContractServer]:
    server = LosingCreates(KEY, gpus=(*GPUS, ADA))
    server.knobs.serverless_url = SERVERLESS_URL
    yield server
    assert server.violations == []
    assert server.client_errors == []
    assert not server.key_in_url


@pytest.fixture
def url(server: ContractServer) -> Iterator[str]:
    with running_runpod_v2(server) as base:
        yield base


def runpod(url: str, **over: Any) -> RunPodSettings:
    return RunPodSettings(api_key=SecretStr(KEY), base_url=url, backoff_s=0.01, **over)


def night(**over: Any) -> TierConfig:
    fields: dict[str, Any] = {
        "name": "night",
        "batch_only": True,
        "max_workers": 3,
        "gpu_types": ("NVIDIA L4",),
        "serverless": ServerlessConfig(idle_timeout_s=2),
        "serverless_price_per_s": 0.00019,
    }
    return TierConfig(**{**fields, **over})


def keeper(url: str, *tiers: TierConfig, **over: Any) -> ServerlessEndpoints:
    return ServerlessEndpoints(runpod(url, **over), "fr", list(tiers), WORKER_ENV)


async def reconcile(url: str, *tiers: TierConfig, **over: Any) -> ServerlessEndpoints:
    """A keeper (an orchestrator's start) that has reconciled once."""
    k = keeper(url, *tiers, **over)
    try:
        await k.tick()
    finally:
        await k.aclose()
    return k


def calls(server: ContractServer, method: str, template: str) -> list[Any]:
    return [e for e in server.requests(method, template) if e.status < 400]


async def test_an_endpoint_is_created_once_from_the_worker_image_with_workers_from_zero(
    server: ContractServer, url: str
) -> None:
    tier = night(volume=TierVolume(runpod_id="vol1", data_center="US-KS-2"))
    k = await reconcile(url, tier, registry="cred1")
    assert k.problems == {} and k.counters["created"] == 1
    (made,) = server.endpoints.values()
    assert made["name"] == "fr-night" and made["type"] == "QUEUE"
    assert made["image"] == "framerelay/worker:0.1.0" and made["args"] == WORKER_ARGS
    assert made["registry"] == "cred1" and made["disk"] == 20
    assert made["workers"] == {"min": 0, "max": 3, "idleTimeout": 2}
    assert made["scaling"] == {"type": "QUEUE_DELAY", "queueDelay": 4.0}
    assert made["flashboot"] == "FLASHBOOT" and made["timeout"] == 600_000
    assert made["networkVolumes"] == ["vol1"] and made["dataCenterIds"] == ["US-KS-2"]
    # the pool of the tier's one type, without the pool's other type; the pods' CUDA floor
    assert made["gpu"]["pools"] == ["ADA_24"] and made["gpu"]["count"] == 1
    assert made["gpu"]["excludedTypes"] == [ADA.id] and made["gpu"]["minCudaVersion"] == "12.8"
    env = made["env"]
    assert env["FRAMERELAY_WORKER_WORKER_ID"] == "fr-night"
    assert env[VOLUME_ENV] == SERVERLESS_VOLUME
    assert env["FRAMERELAY_WORKER_DETECTOR__CACHE_DIR"].startswith(SERVERLESS_VOLUME)
    assert env["FRAMERELAY_WORKER_TUNNEL_KEYS"] == WORKER_ENV["FRAMERELAY_WORKER_TUNNEL_KEYS"]
    assert not [name for name in env if "SIGNING" in name or "SECRET" in name]
    ready = k.ready["night"]
    assert (ready.id, ready.name) == (made["id"], "fr-night")


async def test_a_second_reconcile_and_a_restarted_orchestrator_take_the_endpoint_as_it_is(
    server: ContractServer, url: str
) -> None:
    first = keeper(url, night())
    try:
        await first.reconcile()
        await first.reconcile()  # the next check: nothing to do
    finally:
        await first.aclose()

    again = await reconcile(url, night())  # another process: finds it by name
    assert len(calls(server, "POST", "/v2/serverless")) == 1 and len(server.endpoints) == 1
    assert calls(server, "PATCH", "/v2/serverless/{id}") == []
    assert (first.counters["created"], first.counters["taken"], again.counters["taken"]) == (
        1,
        1,
        1,
    )
    assert first.ready["night"] == again.ready["night"]


async def test_changed_settings_are_one_patch_of_the_changed_fields_alone(
    server: ContractServer, url: str
) -> None:
    await reconcile(url, night())
    (endpoint_id,) = server.endpoints
    changed = night(
        max_workers=6,
        gpu_types=("NVIDIA L4", "NVIDIA RTX A5000"),
        serverless=ServerlessConfig(idle_timeout_s=30, flashboot="OFF"),
    )
    k = await reconcile(url, changed, allowed_cuda_versions=("12.8",))
    (patch,) = calls(server, "PATCH", "/v2/serverless/{id}")
    assert patch.path == f"/v2/serverless/{endpoint_id}" and k.counters["updated"] == 1
    now = server.endpoints[endpoint_id]
    assert now["workers"] == {"min": 0, "max": 6, "idleTimeout": 30} and now["flashboot"] == "OFF"
    assert now["gpu"]["pools"] == ["ADA_24", "AMPERE_24"]
    assert now["gpu"]["excludedTypes"] == [ADA.id]
    assert now["gpu"]["allowedCudaVersions"] == ["12.8"] and now["gpu"]["minCudaVersion"] is None
    assert len(server.endpoints) == 1 and len(calls(server, "POST", "/v2/serverless")) == 1
    await reconcile(url, changed, allowed_cuda_versions=("12.8",))  # now as the settings say
    assert len(calls(server, "PATCH", "/v2/serverless/{id}")) == 1


def test_patch_body_names_only_what_differs() -> None:
    desired = {
        "image": "img:2",
        "env": {"A": "1"},
        "gpu": {"pools": ["ADA_24"], "count": 1, "minCudaVersion": "12.8"},
        "workers": {"min": 0, "max": 2, "idleTimeout": 5},
    }
    current = {
        "image": "img:1",
        "env": {"A": "1"},
        "registry": None,
        "gpu": {
            "pools": ["ADA_24"],
            "count": 1,
            "allowedCudaVersions": [],
            "minCudaVersion": "12.8",
        },
        "workers": {"min": 0, "max": 2, "idleTimeout": 5},
    }
    assert patch_body(current, desired) == {"image": "img:2"}
    current["gpu"] = {"pools": ["ADA_24"], "count": 1, "allowedCudaVersions": ["12.4"]}
    assert patch_body(current, desired)["gpu"] == {
        "pools": ["ADA_24"],
        "excludedTypes": [],
        "count": 1,
        "allowedCudaVersions": [],
        "minCudaVersion": "12.8",
    }


async def test_an_answer_lost_after_the_create_never_makes_a_second_endpoint(
    server: LosingCreates, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    server.lose = 1  # RunPod makes it, the answer is a 500
    server.knobs.rate_limit_next = 1  # and the first list is throttled
    with caplog.at_level(logging.DEBUG):
        k = await reconcile(url, night())
    assert len(server.endpoints) == 1 and len(server.requests("POST", "/v2/serverless")) == 1
    assert k.ready["night"].id in server.endpoints and k.problems == {}
    assert "taken, not created again" in caplog.text and KEY not in caplog.text


async def test_request_urls_are_runpods_answer_not_built_from_the_id(
    server: ContractServer, url: str
) -> None:
    server.knobs.serverless_url = "https://queue.example.net/v9"  # not where ids would say
    k = await reconcile(url, night())
    ready = k.ready["night"]
    assert ready.urls.run == f"https://queue.example.net/v9/{ready.id}/run"
    assert (
        ready.urls.for_job(ready.urls.status, "j1")
        == f"https://queue.example.net/v9/{ready.id}/status/j1"
    )
    documented = {  # RunPod's own example: {job_id} stands for the job
        "requestUrls": {
            "run": "https://api.runpod.ai/v2/4m7x2k9q/run",
            "status": "https://api.runpod.ai/v2/4m7x2k9q/status/{job_id}",
            "cancel": "https://api.runpod.ai/v2/4m7x2k9q/cancel/{job_id}",
            "health": "https://api.runpod.ai/v2/4m7x2k9q/health",
        }
    }
    urls = request_urls(documented, "fr-night")
    assert urls.for_job(urls.cancel, "j2") == "https://api.runpod.ai/v2/4m7x2k9q/cancel/j2"
    with pytest.raises(ProviderError, match="no requestUrls run/status/cancel/health"):
        request_urls({"requestUrls": {"base": "https://x.api.runpod.ai"}}, "fr-night")
    plain = {
        "requestUrls": {k: v.replace("https", "http") for k, v in documented["requestUrls"].items()}
    }
    with pytest.raises(ProviderError, match="refusing plain http://"):
        request_urls(plain, "fr-night")


async def test_an_endpoint_of_the_name_that_is_not_queue_based_is_reported_not_touched(
    server: ContractServer, url: str
) -> None:
    made = api_post(
        url,
        KEY,
        "/serverless",
        {
            "name": "fr-night",
            "type": "LOAD_BALANCER",
            "image": "someone/else:1",
            "gpu": {"pools": ["ADA_24"]},
            "scaling": {"type": "REQUEST_COUNT", "requestCount": 4},
        },
    )  # an operator's, by hand
    k = await reconcile(url, night())
    assert "is LOAD_BALANCER, not QUEUE: delete it" in k.problems["night"]
    assert k.ready == {} and calls(server, "PATCH", "/v2/serverless/{id}") == []
    assert list(server.endpoints) == [made["id"]]


async def test_a_failed_reconcile_is_tried_again_on_the_next_pass(
    server: ContractServer, url: str
) -> None:
    k = keeper(url, night(), max_retries=0)
    try:
        server.knobs.fail_next = 1
        await k.tick()  # RunPod answers 500: no endpoint yet, no exception
        failed = dict(k.problems)
        await k.tick()  # the next pass
        ready = dict(k.ready)
    finally:
        await k.aclose()

    assert "failed after 1 attempts" in failed["night"] and KEY not in failed["night"]
    assert list(ready) == ["night"] and len(server.endpoints) == 1


def test_a_tier_whose_gpu_types_have_no_serverless_pool_says_so() -> None:
    pools = {"NVIDIA L4": "ADA_24", "NVIDIA H100 NVL": None}
    with pytest.raises(ProviderError, match=r"none of its gpu_types .* serverless pool"):
        gpu_choice(night(gpu_types=("NVIDIA H100 NVL",)), pools)
    choice = gpu_choice(night(gpu_types=("NVIDIA H100 NVL", "NVIDIA L4")), pools)
    assert (choice.pools, choice.excluded) == (("ADA_24",), ())


async def test_a_job_on_a_managed_tier_carries_its_endpoints_urls_to_its_tasks(
    server: ContractServer, url: str
) -> None:
    settings = OrchestratorSettings(signing_keys=ed_keys().to_json(), tiers=[night()])
    spec = JobSpec(inputs=["/r/a.mp4"], serverless=True)
    with pytest.raises(NoServerlessTier, match="night's serverless endpoint is not ready"):
        choose(settings, spec, {})  # before the orchestrator made it
    assert choose(settings, spec.model_copy(update={"serverless": None}), {}) is None  # pods
    ready = (await reconcile(url, night())).ready
    choice = choose(settings, spec, ready)
    assert choice is not None and choice.urls == ready["night"].urls
    assert (choice.tier, choice.endpoint_id, choice.price_per_s) == (
        "night",
        ready["night"].id,
        0.00019,
    )
    rec = JobRecord(
        id="j1",
        spec=spec,
        tasks=[TaskRecord(input="/r/a.mp4", sidecar="/r/a.jsonl")],
        submitted_at=1.0,
        serverless=choice,
    )
    job = task_spec(rec, 0).job
    assert job is not None and job.serverless_urls == ready["night"].urls
    assert job.serverless_endpoint_id == ready["night"].id
    stored = JobRecord.model_validate_json(rec.model_dump_json())  # kept in Redis as JSON
    assert stored.serverless is not None and stored.serverless.urls == choice.urls


def test_settings_of_a_managed_tier() -> None:
    tier = night()
    assert not tier.rents_pods and tier.serverless is not None
    with pytest.raises(ValidationError, match=r"give serverless .* or serverless_endpoint_id"):
        night(serverless_endpoint_id="abc")
    with pytest.raises(ValidationError, match="flashboot"):
        ServerlessConfig.model_validate({"flashboot": "ON"})
    from_env = TierConfig.model_validate_json(
        json.dumps({"name": "night", "serverless": {"idle_timeout_s": 9}})
    )
    assert from_env.serverless == ServerlessConfig(idle_timeout_s=9)
    keyless = OrchestratorSettings(signing_keys=ed_keys().to_json(), tiers=[tier])
    with pytest.raises(ConfigError, match="FRAMERELAY_ORCH_RUNPOD__API_KEY"):
        make_endpoints(keyless, ed_keys())
    plain = OrchestratorSettings(signing_keys=ed_keys().to_json(), tiers=[night(serverless=None)])
    assert make_endpoints(plain, ed_keys()) is None
