"""The RunPod provider against the RunPod API v2 contract server (real HTTP on 127.0.0.1;
every request and answer checked against RunPod's published schema): create from the
catalog's stock and prices, the pod's status and address, the lifecycle actions,
RFC 9457 problems as one line, idempotent creates, unreachable and ERROR pods."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import httpx
import pytest
from pydantic import SecretStr, ValidationError

from bench.rig.runpod_v2_contract import ContractServer, running_runpod_v2
from deploy.models import PodInfo, PodSpec, PodStatus
from deploy.providers.base import NoCapacityError, ProviderError
from deploy.providers.runpod.client import RunPodHttp, refusal
from deploy.providers.runpod.provider import RunPodProvider
from deploy.settings import OrchestratorSettings, RunPodSettings, TierConfig
from framerelay.settings import describe_invalid

KEY = "rpa_" + "K3yN0tF0rL0gs" * 3
TLS_KEY = "-----BEGIN PRIVATE KEY-----not-in-logs"
A4000, A5000, L4 = "NVIDIA RTX A4000", "NVIDIA RTX A5000", "NVIDIA L4"
CREATE = ("POST", "/v2/pods")


@dataclass
class Rig:
    server: ContractServer
    url: str
    now: list[float]
    """The clock both the server and the provider read (seconds)."""

    def provider(self, **over: Any) -> RunPodProvider:
        settings = RunPodSettings(
            api_key=SecretStr(KEY), base_url=self.url, backoff_s=0.02, image="img:1", **over
        )
        return RunPodProvider(settings, clock=lambda: self.now[0])

    def posts(self) -> list[int]:
        """The statuses of every create sent."""
        return [e.status for e in self.server.requests(*CREATE)]


@pytest.fixture
def rig() -> Iterator[Rig]:
    now = [1000.0]
    server = ContractServer(KEY, clock=lambda: now[0])
    with running_runpod_v2(server) as url:
        yield Rig(server, url, now)
    assert server.violations == []  # the server's own answers fit RunPod's schema
    assert server.client_errors == []  # and everything the provider sent does too
    assert not server.key_in_url


def spec(name: str = "fr-community-0-g0", **over: Any) -> PodSpec:
    base = PodSpec(
        name=name,
        tier="community",
        spot=False,
        gpu_types=(A4000, A5000),
        cloud_types=("COMMUNITY", "SECURE"),
        env={"FRAMERELAY_WORKER_WORKER_ID": name, "FRAMERELAY_WORKER_TUNNEL_KEYS": '{"keys": []}'},
        secret_env={
            "FRAMERELAY_WORKER_TLS_CERT_PEM": SecretStr("-----BEGIN CERTIFICATE-----"),
            "FRAMERELAY_WORKER_TLS_KEY_PEM": SecretStr(TLS_KEY),
        },
        tls_server_name=f"{name}.pods.framerelay",
    )
    return replace(base, **over)


async def run(provider: RunPodProvider, *steps: Any) -> list[Any]:
    """Await each step (a coroutine function of the provider) in turn; close the provider."""
    try:
        return [await step(provider) for step in steps]
    finally:
        await provider.aclose()


async def test_create_get_list_stop_start_terminate(rig: Rig) -> None:
    async def lifecycle(p: RunPodProvider) -> dict[str, Any]:
        info = await p.create(spec())
        got = await p.get(info.id)
        listed = await p.list()
        prices = await p.prices()
        await p.stop(info.id)
        stopped = await p.get(info.id)
        await p.start(info.id)
        await p.terminate(info.id)
        gone = await p.get(info.id)
        await p.terminate(info.id)  # already gone: fine
        return {
            "info": info,
            "got": got,
            "listed": listed,
            "prices": prices,
            "stopped": stopped,
            "gone": gone,
        }

    (out,) = await run(rig.provider(), lifecycle)
    info, got = out["info"], out["got"]
    assert info.name == "fr-community-0-g0" and not info.spot
    assert (info.gpu_type, info.cloud_type) == (A4000, "COMMUNITY")  # the cheapest with stock
    assert info.cost_per_hr == pytest.approx(0.20)  # the pod's own cost: community A4000
    assert info.status is PodStatus.PROVISIONING and info.tunnel_url is None
    assert got is not None and got.status is PodStatus.RUNNING
    assert got.tunnel_url is not None and got.tunnel_url.startswith("wss://127.0.0.1:")
    assert got.tunnel_url.endswith("/v1/tunnel")
    assert got.http_url is not None and got.http_url.startswith("https://")
    assert got.tls_server_name == "fr-community-0-g0.pods.framerelay"
    assert [p.id for p in out["listed"]] == [info.id]
    price = out["prices"][A4000]
    assert (price.ondemand, price.community, price.secure_spot) == (0.32, 0.20, None)
    assert out["stopped"].status is PodStatus.EXITED and out["stopped"].cost_per_hr == 0
    assert out["gone"] is None and not rig.server.pods
    assert rig.posts() == [201]
    actions = rig.server.requests("POST", "/v2/pods/{id}/action")
    assert [e.status for e in actions] == [200, 200, 204, 404]


async def test_the_create_body_is_nested_and_asks_for_cuda_12_8(rig: Rig) -> None:
    (info,) = await run(rig.provider(registry="reg1"), lambda p: p.create(spec()))
    pod = rig.server.pods[info.id]
    assert pod.gpu == {"id": A4000, "count": 1} and pod.cuda == "12.8"  # minCudaVersion 12.8
    assert (pod.image, pod.disk, pod.registry, pod.args) == ("img:1", 20, "reg1", "")
    assert pod.ports == ["8443/tcp"] and pod.cloud == "COMMUNITY"
    assert pod.env["FRAMERELAY_WORKER_TLS_KEY_PEM"] == TLS_KEY  # delivered by RunPod's env
    reads = rig.server.requests("GET", "/v2/catalog/gpus")
    assert len(reads) == 2  # one per cloud the tier allows
    assert all(
        e.query_names == ["cloud", "count", "include", "minCudaVersion", "product"] for e in reads
    )


async def test_the_cheapest_type_that_fits_the_vram_need_and_has_stock_wins(rig: Rig) -> None:
    need_20 = spec(gpu_types=(A4000, L4, A5000), min_vram_gb=20)  # the 16 GB A4000 is out
    per_fps = replace(need_20, name="fr-community-1-g0", gpu_fps={L4: 60.0, A5000: 40.0})

    infos = await run(rig.provider(), lambda p: p.create(need_20), lambda p: p.create(per_fps))
    # per hour: A5000 community 0.26 < L4 0.30; per fps: L4 0.30/60 < A5000 0.26/40
    assert [(i.gpu_type, i.cloud_type) for i in infos] == [(A5000, "COMMUNITY"), (L4, "COMMUNITY")]


async def test_no_stock_for_the_first_type_goes_to_the_next_without_a_blind_create(
    rig: Rig,
) -> None:
    rig.server.knobs.no_stock = {(A4000, "*")}
    (info,) = await run(rig.provider(), lambda p: p.create(spec()))
    assert info.gpu_type == A5000 and rig.posts() == [201]  # nothing sent into no stock


async def test_no_stock_anywhere_sends_no_create_and_says_why(rig: Rig) -> None:
    rig.server.knobs.no_stock = {(A4000, "*"), (A5000, "COMMUNITY")}
    with pytest.raises(NoCapacityError) as err:
        await run(rig.provider(), lambda p: p.create(spec(cloud_types=("COMMUNITY",))))
    assert rig.posts() == []
    assert "NVIDIA RTX A4000/COMMUNITY: no stock (NONE)" in str(err.value)
    assert "\n" not in str(err.value) and "nothing created" in str(err.value)


async def test_stock_gone_since_the_catalog_read_moves_on_and_is_remembered(rig: Rig) -> None:
    async def race(p: RunPodProvider) -> list[PodInfo]:
        await p.prices()  # the catalog read...
        await p.catalog.offers("COMMUNITY", 1)
        rig.server.knobs.no_stock = {(A4000, "COMMUNITY")}  # ...then A4000 sells out
        first = await p.create(spec())
        second = await p.create(spec("fr-community-1-g0"))
        return [first, second]

    (infos,) = await run(rig.provider(), race)
    assert [i.gpu_type for i in infos] == [A5000, A5000]
    assert rig.posts() == [400, 201, 201]  # the refused one is not asked again


async def test_a_500_after_the_pod_was_made_creates_no_second_pod(rig: Rig) -> None:
    rig.server.knobs.fail_after_create = 1
    p = rig.provider()
    (info,) = await run(p, lambda p: p.create(spec()))
    assert [pod.name for pod in rig.server.pods.values()] == ["fr-community-0-g0"]
    assert info.id in rig.server.pods and rig.posts() == [500]  # found by name, not re-sent
    assert rig.server.requests("GET", "/v2/pods")


async def test_500s_and_429s_are_retried_and_a_create_looks_before_it_resends(rig: Rig) -> None:
    rig.server.knobs.rate_limit_next = 1  # the catalog read: 429, then 500s on the way
    rig.server.knobs.retry_after_s = 0
    p = rig.provider()

    async def create(p: RunPodProvider) -> PodInfo:
        await p.catalog.offers("COMMUNITY", 1)
        await p.catalog.offers("SECURE", 1)
        rig.server.knobs.fail_next = 2  # the create, then the look-up by name
        return await p.create(spec())

    (info,) = await run(p, create)
    assert p.retries == 3 and len(rig.server.pods) == 1 and info.id in rig.server.pods
    assert rig.posts() == [500, 201]


async def test_persistent_500s_give_up_without_leaking_the_key(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.server.knobs.fail_next = 100
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ProviderError, match="after 3 attempts: HTTP 500") as info:
        await run(rig.provider(max_retries=2), lambda p: p.list())
    assert KEY not in str(info.value) and KEY not in repr(info.value)
    assert KEY not in caplog.text
    assert KEY not in repr(RunPodSettings(api_key=SecretStr(KEY)))


async def test_a_bad_key_says_which_setting_to_fix_and_is_not_retried(rig: Rig) -> None:
    settings = RunPodSettings(api_key=SecretStr("wrong"), base_url=rig.url)
    with pytest.raises(ProviderError) as err:
        await run(RunPodProvider(settings), lambda p: p.list())
    assert str(err.value) == (
        "RunPod could not list pods: HTTP 401 Unauthorized: invalid API key: RunPod refused "
        "the API key: set a valid one in FRAMERELAY_ORCH_RUNPOD__API_KEY (or ..._API_KEY_FILE)"
    )
    assert len(rig.server.exchanges) == 1


def test_a_refused_field_comes_back_as_one_line_naming_it(rig: Rig) -> None:
    body = {"name": "x", "image": "img:1", "gpu": {"id": A4000}, "interruptible": True}
    resp = httpx.post(f"{rig.url}/pods", json=body, headers={"Authorization": f"Bearer {KEY}"})
    message = str(refusal(resp, "create pod x"))
    assert message.startswith("RunPod could not create pod x: HTTP 422 Unprocessable Entity: ")
    assert "interruptible" in message and "\n" not in message
    assert message.endswith("(a field or value it does not take): report this line")
    rig.server.exchanges.clear()  # that body was ours on purpose, not the provider's


async def test_an_unknown_template_is_a_clear_error(rig: Rig) -> None:
    with pytest.raises(ProviderError, match="HTTP 404 Not Found: template nosuch not found"):
        await run(rig.provider(), lambda p: p.create(spec(template_id="nosuch")))
    assert not rig.server.pods


async def test_a_pod_from_a_template_leaves_the_image_and_disk_to_it(rig: Rig) -> None:
    async with httpx.AsyncClient() as http:
        resp = await http.post(
            f"{rig.url}/templates",
            headers={"Authorization": f"Bearer {KEY}"},
            json={
                "name": "framerelay-worker",
                "image": "framerelay/worker:9.9",
                "disk": 30,
                "ports": ["8443/tcp"],
                "env": {"FRAMERELAY_WORKER_MAX_BATCH": "8"},
            },
        )
    made = resp.json()
    (info,) = await run(rig.provider(), lambda p: p.create(spec(template_id=made["id"])))
    pod = rig.server.pods[info.id]
    assert (pod.template, pod.image, pod.disk) == (made["id"], "framerelay/worker:9.9", 30)
    assert pod.env["FRAMERELAY_WORKER_MAX_BATCH"] == "8"  # the template's shared env
    assert pod.env["FRAMERELAY_WORKER_WORKER_ID"] == "fr-community-0-g0"  # and the pod's own


async def test_a_two_gpu_pod_exposes_a_port_and_a_worker_per_gpu(rig: Rig) -> None:
    async def two(p: RunPodProvider) -> PodInfo | None:
        info = await p.create(spec(gpu_count=2))
        return await p.get(info.id)

    (got,) = await run(rig.provider(), two)
    (pod,) = rig.server.pods.values()
    assert pod.gpu == {"id": A4000, "count": 2} and pod.ports == ["8443/tcp", "8444/tcp"]
    assert pod.args == "worker --gpus 2" and pod.price == pytest.approx(0.40)
    assert got is not None and len(got.endpoints) == 2 and got.cost_per_hr == pytest.approx(0.4)
    assert got.tunnel_url == got.endpoints[0].tunnel_url
    assert got.tls_server_name == "fr-community-0-g0.pods.framerelay"  # one certificate


async def test_a_pod_without_a_public_port_fails_after_the_grace_and_its_host_goes_last(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.server.knobs.community_public_ip = False
    caplog.set_level(logging.WARNING)
    near = spec(data_centers=("EU-RO-1", "US-KS-2"), cloud_types=("COMMUNITY",))

    async def unreachable(p: RunPodProvider) -> list[PodInfo | None]:
        info = await p.create(near)
        early = await p.get(info.id)  # RUNNING, no public IP: still provisioning
        rig.now[0] += 89
        within = await p.get(info.id)
        rig.now[0] += 2
        late = await p.get(info.id)
        rig.server.knobs.community_public_ip = True
        after = await p.create(replace(near, name="fr-community-0-g1"))
        return [early, within, late, after]

    (infos,) = await run(rig.provider(), unreachable)
    early, within, late, after = infos
    assert early is not None and within is not None and late is not None and after is not None
    assert early.status is within.status is PodStatus.PROVISIONING
    assert late.status is PodStatus.ERROR and late.data_center == "EU-RO-1"
    assert late.reason is not None and late.reason.startswith(
        "RUNNING 91 s with no public IP and port for 8443/tcp (unreachable from the "
        "orchestrator) in EU-RO-1/COMMUNITY: replaced;"
    )
    assert late.reason in caplog.text
    assert after.data_center == "US-KS-2"  # EU-RO-1/COMMUNITY is tried last now


async def test_a_pod_in_error_is_reported_with_its_reason(rig: Rig) -> None:
    rig.server.knobs.boot_errors = ["CUDA driver too old"]

    async def boot(p: RunPodProvider) -> PodInfo | None:
        return await p.get((await p.create(spec())).id)

    (got,) = await run(rig.provider(), boot)
    assert got is not None and got.status is PodStatus.ERROR
    assert got.reason == (
        "RunPod says ERROR (its container cannot recover) for NVIDIA RTX A4000 in EU-RO-1/COMMUNITY"
    )


async def test_allowed_cuda_versions_go_to_the_catalog_and_the_body(rig: Rig) -> None:
    (info,) = await run(rig.provider(allowed_cuda_versions=("12.4",)), lambda p: p.create(spec()))
    assert rig.server.pods[info.id].cuda == "12.4"
    reads = rig.server.requests("GET", "/v2/catalog/gpus")
    assert all("cudaVersions" in e.query_names for e in reads)


async def test_logs_and_errors_never_carry_the_pod_certificate(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    rig.server.knobs.no_stock = {(A4000, "*"), (A5000, "*")}
    with pytest.raises(NoCapacityError) as err:
        await run(rig.provider(), lambda p: p.create(spec()))
    rig.server.knobs.no_stock = set()
    await run(rig.provider(), lambda p: p.create(spec()))
    assert TLS_KEY not in str(err.value) and TLS_KEY not in caplog.text


async def test_a_spot_pod_is_refused_before_anything_is_sent(rig: Rig) -> None:
    with pytest.raises(ProviderError, match='"cloud_types": \\["COMMUNITY"\\]'):
        await run(rig.provider(), lambda p: p.create(spec(spot=True)))
    assert rig.server.exchanges == []


@pytest.mark.parametrize(
    ("runpod", "tiers", "message"),
    [
        (
            {"base_url": "https://rest.runpod.io/v1"},
            None,
            "runpod.base_url (in FRAMERELAY_ORCH_RUNPOD): RunPod's REST API v1 was retired on "
            "2026-11-15: set FRAMERELAY_ORCH_RUNPOD__BASE_URL=https://api.runpod.io/v2 (or unset "
            "it)",
        ),
        ({"base_url": "https://api.runpod.io"}, None, "base_url must end in /v2"),
        (
            {"allowed_cuda_versions": ["12.8"], "min_cuda_version": "12.6"},
            None,
            "give min_cuda_version or allowed_cuda_versions, not both",
        ),
        (
            {},
            [TierConfig(name="cheap", interruptible=True, cloud_types=("COMMUNITY",))],
            'tier cheap: RunPod has no spot (interruptible) pods: give it "interruptible": '
            'false and "cloud_types": ["COMMUNITY"]',
        ),
    ],
)
def test_settings_runpod_v2_cannot_take_are_refused_in_one_line(
    runpod: dict[str, Any], tiers: list[TierConfig] | None, message: str
) -> None:
    with pytest.raises(ValidationError) as err:
        OrchestratorSettings(
            provider="runpod", runpod=runpod, tiers=tiers or [TierConfig(name="od")]
        )
    line = describe_invalid(err.value)
    assert message in line and "\n" not in line


async def test_every_page_of_a_list_is_read() -> None:
    """RunPod's schema of 2026-08 defines no paging, and the contract server plays none;
    the client still follows ``pagination.nextCursor`` where an answer has one (a later
    schema pages its lists), checked with a scripted transport."""
    pages = {
        None: {"pods": [{"id": "a"}], "pagination": {"nextCursor": "c2", "hasNextPage": True}},
        "c2": {"pods": [{"id": "b"}], "pagination": {"nextCursor": None, "hasNextPage": False}},
    }
    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        cursor = request.url.params.get("cursor")
        seen.append(cursor)
        return httpx.Response(200, json=pages[cursor])

    http = RunPodHttp(
        RunPodSettings(api_key=SecretStr(KEY), base_url="https://api.runpod.io/v2"),
        httpx.MockTransport(answer),
    )

    try:
        got = await http.pages("/pods", "pods", "list pods")
    finally:
        await http.aclose()

    assert [p["id"] for p in got] == ["a", "b"] and seen == [None, "c2"]
