"""Issue 15's acceptance, as a user meets it: ``framerelay demo --realtime --loop`` as a
process, its console in real Chromium.

The demo serves the console on 127.0.0.1 and writes a token for it to a private
file (never printed). Each test signs in with that token, the way the demo's
line tells a user to, and reads the page: the stream's row and its numbers,
the live view's pixels, the add form against the real API. Screenshots at
1280x800 and 390x844 go to ``test-artifacts/console/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from framerelay.data import DEFAULT_CLIP
from tests.conftest import TIMEOUT_FACTOR
from tests.support.browser import artifacts, chromium, console_errors, requested_urls
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration]
BOX = (0, 255, 102)  # console.js's box colour
LINE = re.compile(r"console: (http://127\.0\.0\.1:\d+/console) \(sign in with the token in (\S+);")


@dataclass
class Demo:
    proc: subprocess.Popen[str]
    url: str
    token: str
    stderr: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return self.url.removesuffix("/console")

    def get(self, path: str) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"}
        response = httpx.get(self.base + path, headers=headers, timeout=10)
        response.raise_for_status()
        return response.json()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    cwd = tmp_path_factory.mktemp("demo")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
    args = [sys.executable, "-m", "framerelay", "demo", "--realtime", "--loop", "--quiet",
            "--console-port", "0"]  # fmt: skip
    proc = subprocess.Popen(
        args,
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the worker goes with it
    )
    lines: list[str] = []
    found: list[re.Match[str]] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            match = LINE.search(line)
            if match:
                found.append(match)
            if "tunnel up" in line and found:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not ready.wait(120 * TIMEOUT_FACTOR):
            pytest.fail("the demo did not start:\n" + "".join(lines[-30:]))
        url, token_file = found[0].group(1), Path(found[0].group(2))
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        token = token_file.read_text().strip()
        assert token not in "".join(lines)  # the token is in the file, never in the output
        yield Demo(proc, url, token, lines)
    finally:
        stopped = _interrupt(proc)
        reader.join(10)
        if proc.stderr is not None:
            proc.stderr.close()
    assert stopped, "the demo did not exit on Ctrl-C; its output ends:\n" + "".join(lines[-120:])
    assert not Path(found[0].group(2)).exists() if found else True  # removed at exit


def _interrupt(proc: subprocess.Popen[str]) -> bool:
    """Ctrl-C, as a user stops the demo; True if it exited by itself. Else it is sent
    SIGABRT, which makes Python's fault handler (PYTHONFAULTHANDLER) write every thread's
    stack to its stderr (in the failure message: where it hung), then its whole process
    group (its worker too) is killed, so no process outlives the test."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60 * TIMEOUT_FACTOR)  # about a second on an idle machine
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        return False
    return True


def sign_in(driver: Any, demo: Demo, token: str | None = None) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(demo.url)
    wait = WebDriverWait(driver, 30 * TIMEOUT_FACTOR)
    wait.until(lambda d: d.find_element(By.ID, "login").is_displayed())
    driver.find_element(By.ID, "token").send_keys(token or demo.token)
    driver.find_element(By.CSS_SELECTOR, "#login-form button[type=submit]").click()


COLUMNS = ("id", "state", "epoch", "fps_in", "fps_out", "results", "drops", "p50", "p99", "slo",
           "from", "worker", "tier")  # fmt: skip


def row_text(driver: Any, stream_id: str) -> str:
    """The row's cells, tab-separated (the state cell's first line only)."""
    script = """
    const row = document.querySelector(`#streams tbody tr[data-stream="${arguments[0]}"]`);
    return row ? Array.from(row.cells).map((c) => c.firstChild ? c.firstChild.textContent : '')
                 .join('\t') : '';
    """
    return str(driver.execute_script(script, stream_id))


def cells(row: str) -> list[str]:
    return row.split("\t")


def wait_row(driver: Any, stream_id: str, timeout_s: float = 30) -> str:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout_s * TIMEOUT_FACTOR).until(lambda d: row_text(d, stream_id))
    return row_text(driver, stream_id)


def test_the_console_lists_the_demo_stream_and_its_numbers_change(demo: Demo) -> None:
    with chromium() as driver:
        sign_in(driver, demo)
        first = wait_row(driver, "demo-1")
        time.sleep(2.5)
        second = row_text(driver, "demo-1")
        print(f"\n  read 1: {first}\n  read 2: {second}")
        assert "RUNNING" in second and first != second
        assert cells(second)[COLUMNS.index("from")] == "decode"  # a file: no capture clock
        results = [int(cells(r)[COLUMNS.index("results")]) for r in (first, second)]
        assert results[1] > results[0], results  # the Results column counts up
        assert "demo-worker" in driver.find_element("id", "workers").text
        shots = artifacts("console")
        driver.save_screenshot(str(shots / "streams-1280x800.png"))
        driver.set_window_size(390, 844)
        time.sleep(1.2)
        wide = driver.execute_script(
            "return [document.documentElement.scrollWidth, window.innerWidth]"
        )
        driver.save_screenshot(str(shots / "streams-390x844.png"))
        assert wide[0] <= wide[1] + 1, f"the page scrolls sideways at 390 px: {wide}"
        assert row_text(driver, "demo-1")  # the table is still there (it scrolls in its box)
        assert not console_errors(driver)
        host = demo.base
        assert all(u.startswith((host, "data:", "blob:")) for u in requested_urls(driver))


class Results:
    """Every result of a stream from the results WebSocket, by (epoch, seq): the truth the
    live view's pixels are checked against (independent of the page)."""

    def __init__(self, demo: Demo, stream_id: str) -> None:
        self.by_frame: dict[tuple[int, int], dict[str, Any]] = {}
        self.url = demo.base.replace("http", "ws", 1) + f"/v1/results?stream={stream_id}"
        self.headers = {"Authorization": f"Bearer {demo.token}"}
        self.stop = threading.Event()
        self.subscribed = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        assert self.subscribed.wait(30 * TIMEOUT_FACTOR), "no results subscription"

    def _read(self) -> None:
        with connect(self.url, additional_headers=self.headers) as ws:
            self.subscribed.set()
            while not self.stop.is_set():
                try:
                    message = json.loads(ws.recv(timeout=0.5))
                except TimeoutError:
                    continue
                if message.get("type") == "result":
                    record = message.get("result", message)
                    self.by_frame[(record["epoch"], record["seq"])] = record

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


def test_the_live_view_draws_boxes_where_the_results_say(demo: Demo) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    truth = Results(demo, "demo-1")
    try:
        with chromium() as driver:
            sign_in(driver, demo)
            wait_row(driver, "demo-1")
            driver.find_element(By.CSS_SELECTOR, '#streams tr[data-stream="demo-1"] '
                                                 'button[data-action="view"]').click()  # fmt: skip
            canvas = driver.find_element(By.ID, "live")
            wait = WebDriverWait(driver, 30 * TIMEOUT_FACTOR)
            wait.until(lambda d: canvas.get_attribute("data-seq"))
            driver.find_element(By.ID, "trails").click()
            time.sleep(1.0)
            driver.find_element(By.ID, "pause").click()
            shown = _still_canvas(driver)  # a frame being drawn when paused lands first
            driver.save_screenshot(str(artifacts("console") / "live-1280x800.png"))
            key = (int(shown["epoch"]), int(shown["seq"]))
            wait.until(lambda d: key in truth.by_frame)
            record = truth.by_frame[key]
            boxes = [d["box"] for d in record["detections"]]
            print(f"\n  frame {key}: {len(boxes)} boxes, canvas {shown['w']}x{shown['h']}")
            assert boxes, record
            scale, w, h = float(shown["scale"]), int(shown["w"]), int(shown["h"])
            poor = []
            for x1, y1, x2, y2 in boxes:
                # on the box's 3 px line: its left and right edges at half and three
                # quarters of its height, and the middle of its bottom edge (a later box's
                # label may cover some of them)
                my, ly = (y1 + y2) / 2, y1 + 0.75 * (y2 - y1)
                probes = ((x1, my), (x2, my), (x1, ly), (x2, ly), ((x1 + x2) / 2, y2))
                seen = []
                for x, y in probes:
                    px, py = min(w - 1, max(0, int(x * scale))), min(h - 1, max(0, int(y * scale)))
                    seen.append(((px, py), driver.execute_script(PIXEL, px, py)))
                if sum(tuple(rgba[:3]) == BOX for _, rgba in seen) < 3:
                    poor.append(((x1, y1, x2, y2), seen))
            assert not poor, (poor, boxes)
            assert not console_errors(driver)
    finally:
        truth.close()


def _still_canvas(driver: Any) -> dict[str, Any]:
    """The paused canvas once the frame it shows no longer changes (a frame whose image
    was still loading at the pause is drawn after it; on a busy machine, seconds after)."""
    seen: list[dict[str, Any]] = [driver.execute_script(READ_CANVAS)]

    def still() -> bool:
        time.sleep(0.5)
        seen.append(driver.execute_script(READ_CANVAS))
        return seen[-1] == seen[-2]

    wait_until(still, 30, lambda: f"the paused canvas still changing: {seen[-3:]}")
    return seen[-1]


READ_CANVAS = """
const c = document.getElementById('live');
return {epoch: c.dataset.epoch, seq: c.dataset.seq, scale: c.dataset.scale,
        w: c.width, h: c.height};
"""
PIXEL = """
const c = document.getElementById('live');
return Array.from(c.getContext('2d').getImageData(arguments[0], arguments[1], 1, 1).data);
"""


def test_adding_a_stream_in_the_page(demo: Demo) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with chromium() as driver:
        sign_in(driver, demo)
        wait_row(driver, "demo-1")
        wait = WebDriverWait(driver, 60 * TIMEOUT_FACTOR)
        form = fill_form(driver, {"id": "cam-bad", "url": "gopher://example.invalid/x"})
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        error = driver.find_element(By.ID, "form-error")
        wait.until(lambda d: error.text)
        api = httpx.post(demo.base + "/v1/streams", json={"id": "cam-bad",
                         "url": "gopher://example.invalid/x"},
                         headers={"Authorization": f"Bearer {demo.token}"})  # fmt: skip
        print(f"\n  inline: {error.text!r}\n  API:    {api.text}")
        assert api.status_code == 422 and "url" in error.text
        assert "scheme 'gopher' is not allowed" in error.text
        assert api.json()["detail"][0]["msg"] in error.text  # the API's own words
        assert "cam-bad" not in [s["id"] for s in demo.get("/v1/streams")]

        driver.find_element(By.ID, "cancel").click()
        form = fill_form(driver, {"id": "cam-2", "url": str(DEFAULT_CLIP), "fps": "5"},
                         checks=("realtime", "loop"))  # fmt: skip
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait.until(lambda d: not form.is_displayed())
        assert "cam-2" in [s["id"] for s in demo.get("/v1/streams")]
        wait.until(lambda d: demo.get("/v1/streams/cam-2")["results"] > 0)
        wait_row(driver, "cam-2")

        # edit: the form opens with the stream's definition; the change goes through PUT
        driver.find_element(By.CSS_SELECTOR, '#streams tr[data-stream="cam-2"] '
                                             'button[data-action="edit"]').click()  # fmt: skip
        form = driver.find_element(By.ID, "stream-form")
        wait.until(lambda d: form.find_element(By.NAME, "url").get_attribute("value"))
        assert form.find_element(By.NAME, "id").get_attribute("readonly") is not None
        fps = form.find_element(By.NAME, "fps")
        assert fps.get_attribute("value") == "5"
        fps.clear()
        fps.send_keys("3")
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait.until(lambda d: demo.get("/v1/streams/cam-2")["config"]["fps"] == 3)
        assert demo.get("/v1/streams/cam-2")["config"]["loop"] is True  # the rest is kept

        driver.find_element(By.CSS_SELECTOR, '#streams tr[data-stream="cam-2"] '
                                             'button[data-action="remove"]').click()  # fmt: skip
        driver.switch_to.alert.accept()
        wait.until(lambda d: "cam-2" not in [s["id"] for s in demo.get("/v1/streams")])
        assert not console_errors(driver, expected=(422,))  # the refused add


def fill_form(driver: Any, values: dict[str, str], checks: tuple[str, ...] = ()) -> Any:
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, "add").click()
    form = driver.find_element(By.ID, "stream-form")
    for name, value in values.items():
        box = form.find_element(By.NAME, name)
        box.clear()
        box.send_keys(value)
    for name in checks:
        form.find_element(By.NAME, name).click()
    return form


def test_without_a_token_the_console_shows_only_its_login(demo: Demo) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with chromium(390, 844) as driver:
        driver.get(demo.url)
        wait = WebDriverWait(driver, 30 * TIMEOUT_FACTOR)
        wait.until(lambda d: d.find_element(By.ID, "login").is_displayed())
        assert not driver.find_element(By.ID, "app").is_displayed()
        assert "demo-1" not in driver.find_element(By.TAG_NAME, "body").text
        assert not [u for u in requested_urls(driver) if "/v1/" in u]  # asked for no data
        driver.save_screenshot(str(artifacts("console") / "login-390x844.png"))
        sign_in(driver, demo, token="not-a-token")
        error = driver.find_element(By.ID, "login-error")
        wait.until(lambda d: error.text)
        assert "Not signed in" in error.text
        assert not driver.find_element(By.ID, "app").is_displayed()


def test_the_last_hour_charts_draw_what_the_ingest_kept(demo: Demo) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with chromium() as driver:
        sign_in(driver, demo)
        wait_row(driver, "demo-1")
        # the ingest keeps a point every 10 s; the page reads them every 10 s
        wait = WebDriverWait(driver, 45 * TIMEOUT_FACTOR)
        history = demo.get("/v1/history?totals_only=true")
        assert history["streams"] == {}, "totals only"
        wait.until(lambda d: demo.get("/v1/history?totals_only=true")["timestamps"])
        driver.refresh()  # read now rather than at the page's next 10 s (the tab keeps the token)
        wait.until(lambda d: d.execute_script(COLOURED, "chart-fps", [63, 185, 80]) > 0)
        print(f"\n  fps chart: {driver.execute_script(COLOURED, 'chart-fps', [63, 185, 80])} px")
        assert driver.find_element(By.ID, "history-of").text == "all streams"
        assert not console_errors(driver)


COLOURED = """
const c = document.getElementById(arguments[0]);
const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
let n = 0;
for (let i = 0; i < d.length; i += 4) {
  if (Math.abs(d[i] - arguments[1][0]) < 8 && Math.abs(d[i + 1] - arguments[1][1]) < 8
      && Math.abs(d[i + 2] - arguments[1][2]) < 8 && d[i + 3] > 200) n++;
}
return n;
"""
