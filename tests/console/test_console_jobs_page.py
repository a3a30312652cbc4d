"""The console's "Batch jobs" panel in real Chromium (issue 18): a real ingest API reading a
real orchestrator on loopback (real Redis, the real job store): a running job's progress
bar with frames done/total and %, its ETA, cost so far, duration and tasks, moving when the
ingest's progress moves; a finished job's final cost; a failed job's error, full of
HTML-special characters, shown as text (nothing it holds becomes markup); no request leaves
127.0.0.1."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from deploy.api import create_app as orch_app
from deploy.service import Orchestrator
from framerelay.jobs import TaskProgress, progress_key
from tests.conftest import TIMEOUT_FACTOR
from tests.support.auth import ed_keys
from tests.support.browser import artifacts, chromium, console_errors, requested_urls
from tests.support.console import HOSTILE, plain_orchestrator, put_jobs, sign_in
from tests.support.ingest_api import Ingest, running_ingest
from tests.support.orchestrator import serving_here

pytestmark = [pytest.mark.integration]
ROWS = """
return Array.from(document.querySelectorAll('#jobs tbody tr')).map((tr) => {
  const bar = tr.querySelector('progress');
  return {cells: Array.from(tr.cells).map((c) => c.firstChild ? c.firstChild.textContent : ''),
          notes: Array.from(tr.querySelectorAll('.reason')).map((s) => s.textContent),
          value: bar.value, max: bar.max, indeterminate: bar.matches(':indeterminate'),
          frames: tr.querySelector('.frames').textContent};
});
"""


def jobs_shown(driver: Any) -> dict[str, dict[str, Any]]:
    return {row["cells"][0]: row for row in driver.execute_script(ROWS)}


async def test_the_jobs_panel_shows_progress_a_final_cost_and_errors_as_text(
    tmp_path: Path,
) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    async def advance(orch: Orchestrator) -> None:
        """The ingest running segment 1 of night-2 writes 150 frames more."""
        said = TaskProgress(state="running", frames_done=300, frames_total=300)
        key = progress_key(orch.jobs.progress_prefix, "night-2", 1)
        await orch.jobs.progress_redis.set(key, said.model_dump_json())

    def first_look(driver: Any, ingest: Ingest) -> None:
        sign_in(driver, ingest, ingest.token("streams:read"))
        WebDriverWait(driver, 30 * TIMEOUT_FACTOR).until(lambda d: len(jobs_shown(d)) == 4)
        shown = jobs_shown(driver)
        for row in shown.values():
            print(f"\n  {row}")
        running, done, failed, queued = (
            shown[i] for i in ("night-2", "night-1", "bad-1", "later-1")
        )
        assert queued["frames"] == "0 / ? frames" and queued["indeterminate"]
        assert queued["cells"][4:] == ["–", "$0.0000", "–", "0 / 3"]
        # Job, State, Model, Progress, ETA, Cost, Duration, Tasks
        assert running["cells"][1:3] == ["running", "yolox-nano"]
        assert (running["value"], running["max"]) == (450, 900)
        assert running["frames"] == "450 / 900 frames (50.0 %)"
        assert running["cells"][4] == "45 s" and running["cells"][5] == "$0.0123"
        assert running["notes"] == ["so far"] and running["cells"][7] == "1 / 3"
        assert running["cells"][6] in ("2 min", "120 s")
        assert done["cells"][5] == "$0.4321" and done["notes"] == ["final"]
        assert done["frames"] == "900 / 900 frames (100.0 %)" and done["cells"][4] == "–"
        assert (done["cells"][6], done["cells"][7]) == ("15 min", "3 / 3")
        assert failed["cells"][1] == "failed" and failed["notes"] == [HOSTILE, "final"]
        assert failed["frames"] == "10 / 300 frames (3.3 %)"
        markup = "return [window.pwned, document.querySelectorAll('#jobs img, #jobs a').length]"
        assert driver.execute_script(markup) == [None, 0]  # the error is text, not markup
        assert driver.find_element("id", "jobs-summary").text == "4 jobs · 1 running"
        driver.execute_script("document.getElementById('jobs-panel').scrollIntoView()")
        driver.save_screenshot(str(artifacts("console") / "jobs-1280x800.png"))

    def progress_moves(driver: Any) -> None:
        wait = WebDriverWait(driver, 30 * TIMEOUT_FACTOR)
        wait.until(lambda d: jobs_shown(d)["night-2"]["value"] == 600)
        running = jobs_shown(driver)["night-2"]
        print(f"  after: {running}")
        assert running["frames"] == "600 / 900 frames (66.7 %)"
        assert not console_errors(driver)
        host = driver.current_url.split("/console")[0]
        assert all(u.startswith((host, "data:", "blob:")) for u in requested_urls(driver))

    keys = ed_keys()
    async with plain_orchestrator(tmp_path, keys) as orch:
        await put_jobs(orch)
        async with (
            serving_here(orch_app(orch)) as url,
            running_ingest(keys, tmp_path, orchestrator_url=url) as ingest,
        ):
            with chromium() as driver:
                await asyncio.to_thread(first_look, driver, ingest)
                await advance(orch)
                await asyncio.to_thread(progress_moves, driver)
