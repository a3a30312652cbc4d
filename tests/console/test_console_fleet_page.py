"""The console's "Workers and fleet" panel in real Chromium (issue 15): a real ingest API
reading a real orchestrator on loopback, whose fleet runs against the RunPod API v2
contract server (fake clock): pods with provider, tier, GPU, state, canary latency,
uptime and $/h; cost per stream-hour and the savings against all on-demand; the event
log, where a community pod lost with its host and its re-homed streams appear; without an
orchestrator, a note."""

from __future__ import annotations

import asyncio
import datetime as dt
import secrets
from pathlib import Path
from typing import Any

import pytest

from bench.rig.runpod_v2_contract import ContractServer
from deploy.api import create_app as orch_app
from deploy.clock import FakeClock
from tests.conftest import TIMEOUT_FACTOR
from tests.support.browser import artifacts, chromium, console_errors
from tests.support.console import run_with_ingest, sign_in
from tests.support.contract_fleet import (
    GPU,
    WARM_TIERS,
    TimedProber,
    community_pods,
    fleet_on_contract,
    passes,
    stream_spec,
)
from tests.support.ingest_api import Ingest, running_ingest
from tests.support.orchestrator import serving_here

pytestmark = [pytest.mark.integration]


def pods_shown(driver: Any) -> dict[str, list[str]]:
    script = """
    return Array.from(document.querySelectorAll('#pods tbody tr')).map(
        (tr) => Array.from(tr.cells).map((c) => c.firstChild ? c.firstChild.textContent : ''));
    """
    return {row[0]: row for row in driver.execute_script(script)}


async def test_the_fleet_panel_shows_pods_cost_and_a_lost_pod(tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def first_look(driver: Any, ingest: Ingest) -> set[str]:
        sign_in(driver, ingest, ingest.token("streams:read"))
        wait = WebDriverWait(driver, 30 * TIMEOUT_FACTOR)
        wait.until(lambda d: len(pods_shown(d)) == 3)
        for row in pods_shown(driver).values():
            print(f"\n  {row}")
            assert row[1] == "runpod" and row[3] == GPU and row[4].startswith("running")
            assert row[7].startswith("$") and float(row[7][1:]) > 0 and row[8] == "3"
        cost = driver.find_element(By.ID, "fleet-cost").text
        print(f"  {cost}")
        assert "per stream-hour (9 streams)" in cost and "against all on-demand" in cost
        assert "community" in driver.find_element(By.ID, "pods").text
        created = driver.find_element(By.ID, "events").text
        assert created.count("created") == 3, created
        driver.save_screenshot(str(artifacts("console") / "fleet-1280x800.png"))
        return set(pods_shown(driver))

    def after_loss(driver: Any, before: set[str]) -> None:
        events = driver.find_element(By.ID, "events")
        wait = WebDriverWait(driver, 30 * TIMEOUT_FACTOR)
        wait.until(lambda d: "vanished" in events.text)
        wait.until(lambda d: before - set(pods_shown(d)))  # the lost pod left the table
        text = driver.execute_script("return document.getElementById('events').textContent")
        print(f"  events:\n{text}")
        assert "gone from the provider" in text and text.count("moved") >= 3
        assert not console_errors(driver)

    clock = FakeClock(dt.datetime(2026, 3, 2, 12, tzinfo=dt.UTC))
    state = ContractServer("rpa_" + secrets.token_hex(12), clock=clock.now)
    async with fleet_on_contract(state, clock, WARM_TIERS) as orch:
        orch.fleet.prober = TimedProber()
        for i in range(9):
            await orch.store.put_stream(stream_spec(f"std-{i}"))
        await passes(orch, clock, 6)
        async with (
            serving_here(orch_app(orch)) as url,
            running_ingest(orch.keys, tmp_path, orchestrator_url=url) as ingest,
        ):
            with chromium() as driver:
                before = await asyncio.to_thread(first_look, driver, ingest)
                lost = community_pods(state)[0]
                state.vanish(lost)  # its host is lost
                await passes(orch, clock, 4)
                await asyncio.to_thread(after_loss, driver, before)
                assert lost  # the contract server's id of the lost pod


async def test_without_an_orchestrator_the_panel_says_so(tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def check(ingest: Ingest) -> None:
        with chromium() as driver:
            sign_in(driver, ingest, ingest.token("streams:read"))
            note = driver.find_element(By.ID, "fleet-note")
            WebDriverWait(driver, 30 * TIMEOUT_FACTOR).until(lambda d: note.text)
            assert "No orchestrator is configured" in note.text
            assert not driver.find_element(By.ID, "fleet-body").is_displayed()
            assert "demo" not in note.text and not console_errors(driver)

    await run_with_ingest(tmp_path, check)
