"""The consoles ``bench/console.py`` measures: the page in headless Chromium and a bare
SSE client of ``GET /v1/console/streams/events``, each noting when an update arrived."""

from __future__ import annotations

import itertools
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from bench.rig.browser import start_chromium


class ConsoleTarget(Protocol):
    """The ingest a console watches."""

    base: str
    streams: int

    def token(self, scope: str = "streams:read") -> str: ...


HOOK = """
const node = document.getElementById("status-line");
window.__frUpdates = [];
new MutationObserver(() => {
  if (node.textContent.startsWith("updated") && window.__frUpdates.length < 100000) {
    window.__frUpdates.push(performance.now());
  }
}).observe(node, {childList: true, characterData: true, subtree: true});
return performance.now();
"""
"""Notes when the page rewrote its status line with a new ``streams`` event (ms)."""


@dataclass
class Seen:
    """What a console received during a measured window."""

    updates: int
    period_s: float
    """Mean interval between two updates in the window (NaN with fewer than two)."""
    max_gap_s: float
    """Longest wait for an update, the window's edges included."""
    detail: str = ""

    @property
    def per_s(self) -> float:
        return 1 / self.period_s if self.period_s > 0 else 0.0


def seen_of(times: list[float], start: float, end: float, detail: str = "") -> Seen:
    """Updates at ``times`` within [start, end): their mean period and the longest gap."""
    inside = sorted(t for t in times if start <= t < end)
    edges = [start, *inside, end]
    gap = max(b - a for a, b in itertools.pairwise(edges))
    period = (inside[-1] - inside[0]) / (len(inside) - 1) if len(inside) > 1 else math.nan
    return Seen(len(inside), period, gap, detail)


class Console(Protocol):
    name: str

    def open(self) -> None: ...
    def mark(self) -> None: ...
    def seen(self) -> Seen: ...
    def close(self) -> None: ...


class Browser:
    """The console in headless Chromium, offline, as the tests drive it."""

    name = "browser"

    def __init__(self, ingest: ConsoleTarget) -> None:
        self.ingest, self.token = ingest, ingest.token()
        self.driver: Any = None
        self._start = 0.0

    def __enter__(self) -> Browser:
        try:
            self.driver = start_chromium(1280, 800)
        except FileNotFoundError as exc:
            raise SystemExit(str(exc)) from None
        self.driver.set_script_timeout(30)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.driver is not None:
            self.driver.quit()

    @property
    def pid(self) -> int:
        return int(self.driver.service.process.pid)

    def open(self) -> None:
        """The console, signed in, showing every stream; the update counter installed."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        d = self.driver
        d.get(self.ingest.base + "/console")
        wait = WebDriverWait(d, 30)
        wait.until(lambda d: d.find_element(By.ID, "login").is_displayed()
                   or d.find_element(By.ID, "app").is_displayed())  # fmt: skip
        if d.find_element(By.ID, "login").is_displayed():
            d.find_element(By.ID, "token").send_keys(self.token)
            d.find_element(By.CSS_SELECTOR, "#login-form button[type=submit]").click()
        rows = "#streams tbody tr[data-stream]"
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) >= self.ingest.streams)
        d.execute_script(HOOK)

    def mark(self) -> None:
        self._start = float(self.driver.execute_script("return performance.now();"))

    def seen(self) -> Seen:
        now, times, line = self.driver.execute_script(
            "return [performance.now(), window.__frUpdates,"
            " document.getElementById('status-line').textContent];"
        )
        got = seen_of([t / 1000 for t in times], self._start / 1000, float(now) / 1000, line)
        return got

    def close(self) -> None:
        self.driver.get("about:blank")


class SseClient:
    """A plain reader of ``GET /v1/console/streams`` (httpx, streaming) in a thread."""

    name = "sse"

    def __init__(self, ingest: ConsoleTarget) -> None:
        self.url = ingest.base + "/v1/console/streams"
        self.headers = {"Authorization": f"Bearer {ingest.token()}"}
        self.times: list[float] = []
        self.last_bytes = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = 0.0

    def open(self) -> None:
        self.times, self.error = [], None
        self._stop.clear()
        self._thread = threading.Thread(target=self._read, name="sse", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        timeout = httpx.Timeout(10.0, read=10.0)
        try:
            with (
                httpx.Client(timeout=timeout) as http,
                http.stream("GET", self.url, headers=self.headers) as r,
            ):
                r.raise_for_status()
                for line in r.iter_lines():
                    if line == "event: streams":
                        self.times.append(time.monotonic())
                    elif line.startswith("data: "):
                        self.last_bytes = len(line) - 6
                    if self._stop.is_set():
                        return
        except Exception as exc:  # reported with the phase
            self.error = exc

    def mark(self) -> None:
        self._start = time.monotonic()

    def seen(self) -> Seen:
        if self.error is not None:
            raise RuntimeError(f"the SSE client failed: {self.error!r}")
        return seen_of(self.times, self._start, time.monotonic(), f"{self.last_bytes} B/event")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)
