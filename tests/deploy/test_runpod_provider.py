"""The RunPod provider against the contract server (real HTTP on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from pydantic import SecretStr

from bench.rig.runpod_contract import (
    ContractState,
    CreatePod,
    CreateTemplate,
    running_contract_server,
)
from deploy.models import PodInfo, PodSpec, PodStatus
from deploy.providers.base import NoCapacityError, ProviderError
from deploy.providers.runpod import RunPodProvider
from deploy.settings import RunPodSettings

KEY = "rpa_" + "K3yN0tF0rL0gs" * 3
TLS_KEY = "-----BEGIN PRIVATE KEY-----not-in-logs"


@pytest.fixture
def contract() -> Iterator[tuple[ContractState, str]]:
    state = ContractState(KEY)
    with running_contract_server(state) as url:
        yield state, url


def provider(url: str, **over: object) -> RunPodProvider:
    settings = RunPodSettings(
        api_key=SecretStr(KEY), base_url=url, backoff_s=0.02, image="img:1", **over
    )
    return RunPodProvider(settings)


def spec(name: str = "fr-spot-0-g0", spot: bool = True) -> PodSpec:
    return PodSpec(
        name=name, tier="spot", spot=spot, gpu_types=("NVIDIA RTX A4000", "NVIDIA RTX A5000"),
        cloud_types=("COMMUNITY", "SECURE"),
        env={"FRAMERELAY_WORKER_WORKER_ID": name, "FRAMERELAY_WORKER_TUNNEL_KEYS": '{"keys": []}'},
        secret_env={"FRAMERELAY_WORKER_TLS_CERT_PEM": SecretStr("-----BEGIN CERTIFICATE-----"),
                    "FRAMERELAY_WORKER_TLS_KEY_PEM": SecretStr(TLS_KEY)},
        tls_server_name=f"{name}.pods.framerelay",
    )  # fmt: skip


def test_create_reads_cost_status_and_endpoint(contract: tuple[ContractState, str]) -> None:
    state, url = contract

    async def main() -> None:
        p = provider(url)
        info = await p.create(spec())
        assert info.name == "fr-spot-0-g0" and info.spot
        assert info.gpu_type == "NVIDIA RTX A4000"
        assert info.cost_per_hr == pytest.approx(0.10)  # community spot
        assert info.status is PodStatus.RUNNING and info.tunnel_url is not None
        assert info.tunnel_url.endswith("/v1/tunnel") and info.tunnel_url.startswith("wss://")
        assert info.http_url is not None and info.http_url.startswith("https://")
        assert info.tls_server_name == "fr-spot-0-g0.pods.framerelay"
        (listed,) = await p.list()
        assert listed.id == info.id
        prices = await p.prices()
        assert prices["NVIDIA RTX A4000"].ondemand == pytest.approx(0.32)
        await p.stop(info.id)
        got = await p.get(info.id)
        assert got is not None and got.status is PodStatus.EXITED
        await p.terminate(info.id)
        assert await p.get(info.id) is None
        await p.terminate(info.id)  # already gone: fine
        await p.aclose()

    asyncio.run(main())
    pod_posts = [r for r in state.requests if r == ("POST", "/v1/pods")]
    assert len(pod_posts) == 1 and not state.key_in_url
    assert not state.pods  # terminated


def test_no_capacity_moves_to_the_next_gpu_type(contract: tuple[ContractState, str]) -> None:
    state, url = contract
    state.faults.no_capacity = {("NVIDIA RTX A4000", "*")}

    async def main() -> str:
        p = provider(url)
        try:
            return (await p.create(spec())).gpu_type
        finally:
            await p.aclose()

    assert asyncio.run(main()) == "NVIDIA RTX A5000"
    assert len(state.pods) == 1
    assert [r for r in state.requests if r[0] == "POST"] == [("POST", "/v1/pods")] * 3


def test_no_capacity_anywhere_is_a_clear_error(contract: tuple[ContractState, str]) -> None:
    state, url = contract
    state.faults.no_capacity = {("NVIDIA RTX A4000", "*"), ("NVIDIA RTX A5000", "*")}

    async def main() -> None:
        p = provider(url)
        try:
            await p.create(spec())
        finally:
            await p.aclose()

    with pytest.raises(NoCapacityError, match="tried NVIDIA RTX A4000/COMMUNITY"):
        asyncio.run(main())
    assert not state.pods


def test_500s_and_429s_are_retried_with_backoff(contract: tuple[ContractState, str]) -> None:
    state, url = contract
    state.faults.fail_next = 2
    state.faults.rate_limit_next = 1

    async def main() -> int:
        p = provider(url)
        try:
            await p.create(spec())
            return p.retries
        finally:
            await p.aclose()

    assert asyncio.run(main()) == 3
    assert len(state.pods) == 1


def test_persistent_500s_give_up_without_leaking_the_key(
    contract: tuple[ContractState, str], caplog: pytest.LogCaptureFixture
) -> None:
    state, url = contract
    state.faults.fail_next = 100
    caplog.set_level(logging.DEBUG)

    async def main() -> None:
        p = provider(url, max_retries=2)
        try:
            await p.list()
        finally:
            await p.aclose()

    with pytest.raises(ProviderError, match="after 3 attempts") as info:
        asyncio.run(main())
    assert KEY not in str(info.value) and KEY not in repr(info.value)
    assert KEY not in caplog.text
    assert KEY not in repr(RunPodSettings(api_key=SecretStr(KEY)))


def test_bad_key_and_bad_request_are_not_retried(contract: tuple[ContractState, str]) -> None:
    state, url = contract

    async def main() -> None:
        p = RunPodProvider(RunPodSettings(api_key=SecretStr("wrong"), base_url=url))
        try:
            await p.list()
        finally:
            await p.aclose()

    with pytest.raises(ProviderError, match="HTTP 401"):
        asyncio.run(main())
    assert len(state.requests) == 1


def test_slow_provisioning_shows_as_provisioning(contract: tuple[ContractState, str]) -> None:
    state, url = contract
    state.faults.provision_s = 3600

    async def main() -> PodStatus:
        p = provider(url)
        try:
            info = await p.create(spec())
            assert info.tunnel_url is None
            return info.status
        finally:
            await p.aclose()

    assert asyncio.run(main()) is PodStatus.PROVISIONING


def test_pod_env_carries_the_certificate_but_logs_and_errors_do_not(
    contract: tuple[ContractState, str], caplog: pytest.LogCaptureFixture
) -> None:
    state, url = contract
    caplog.set_level(logging.DEBUG)
    state.faults.no_capacity = {("NVIDIA RTX A4000", "*"), ("NVIDIA RTX A5000", "*")}

    async def main() -> None:
        p = provider(url)
        try:
            await p.create(spec())
        finally:
            await p.aclose()

    with pytest.raises(NoCapacityError) as info:
        asyncio.run(main())
    assert TLS_KEY not in str(info.value) and TLS_KEY not in caplog.text
    state.faults.no_capacity = set()
    asyncio.run(main())
    (pod,) = state.pods.values()
    assert pod["env"]["FRAMERELAY_WORKER_TLS_KEY_PEM"] == TLS_KEY  # delivered by RunPod's env
    assert TLS_KEY not in caplog.text


def _posted(state: ContractState) -> dict[str, Any]:
    (pod,) = state.pods.values()
    return pod


def test_a_two_gpu_pod_exposes_a_port_and_a_worker_per_gpu(
    contract: tuple[ContractState, str],
) -> None:
    state, url = contract
    two = replace(spec(), gpu_count=2)

    async def main() -> tuple[PodInfo, PodInfo | None]:
        p = provider(url)
        try:
            info = await p.create(two)
            return info, await p.get(info.id)
        finally:
            await p.aclose()

    created, got = asyncio.run(main())
    pod = _posted(state)
    assert pod["gpuCount"] == 2 and pod["ports"] == ["8443/tcp", "8444/tcp"]
    assert pod["dockerStartCmd"] == ["worker", "--gpus", "2"]
    assert pod["costPerHr"] == "0.2"  # two community spot A4000s
    for info in (created, got):
        assert info is not None and len(info.endpoints) == 2
        assert info.tunnel_url == info.endpoints[0].tunnel_url
        assert info.tls_server_name == "fr-spot-0-g0.pods.framerelay"  # one certificate


def test_one_gpu_pods_keep_the_image_command(contract: tuple[ContractState, str]) -> None:
    state, url = contract

    async def main() -> None:
        p = provider(url)
        try:
            await p.create(spec())
        finally:
            await p.aclose()

    asyncio.run(main())
    pod = _posted(state)
    assert pod["ports"] == ["8443/tcp"] and pod["dockerStartCmd"] == []
    assert pod["image"] == "img:1" and pod["templateId"] is None


def test_a_pod_from_a_template_leaves_the_image_and_disk_to_it(
    contract: tuple[ContractState, str],
) -> None:
    state, url = contract
    template = state.add_template(
        CreateTemplate(
            name="framerelay-worker", imageName="framerelay/worker:9.9", containerDiskInGb=30,
            ports=["8443/tcp"], env={"FRAMERELAY_WORKER_MAX_BATCH": "8"},
        )
    )  # fmt: skip

    async def main() -> None:
        p = provider(url)
        try:
            await p.create(replace(spec(), template_id=template["id"]))
        finally:
            await p.aclose()

    asyncio.run(main())
    pod = _posted(state)
    assert pod["templateId"] == template["id"] and pod["image"] == "framerelay/worker:9.9"
    assert pod["containerDiskInGb"] == 30
    assert pod["env"]["FRAMERELAY_WORKER_MAX_BATCH"] == "8"  # the template's shared env
    assert pod["env"]["FRAMERELAY_WORKER_WORKER_ID"] == "fr-spot-0-g0"  # and the pod's own
    assert not state.key_in_url


def test_the_create_body_names_the_template_and_omits_what_it_supplies() -> None:
    p = RunPodProvider(RunPodSettings(api_key=SecretStr(KEY), image="img:1"))
    body = p._body(replace(spec(), template_id="tpl1"), "NVIDIA L4", "SECURE", None)
    assert body["templateId"] == "tpl1"
    assert "imageName" not in body and "containerDiskInGb" not in body
    assert body["ports"] == ["8443/tcp"] and body["gpuCount"] == 1
    plain = p._body(spec(), "NVIDIA L4", "SECURE", None)
    assert plain["imageName"] == "img:1" and "templateId" not in plain
    CreatePod.model_validate(body)  # both are bodies the contract accepts
    CreatePod.model_validate(plain)
    asyncio.run(p.aclose())


def test_an_unknown_template_is_a_clear_error(contract: tuple[ContractState, str]) -> None:
    state, url = contract

    async def main() -> None:
        p = provider(url)
        try:
            await p.create(replace(spec(), template_id="nosuch"))
        finally:
            await p.aclose()

    with pytest.raises(ProviderError, match="HTTP 400: template nosuch not found"):
        asyncio.run(main())
    assert not state.pods
