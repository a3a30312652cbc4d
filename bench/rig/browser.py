"""Headless Chromium (Debian's ``chromium`` + ``chromium-driver``), offline, for the
console's tests and its benchmark: every host name but 127.0.0.1 resolves to nothing,
so a page that reaches for a CDN fails visibly."""

from __future__ import annotations

import shutil
from typing import Any

MISSING = "chromium/chromedriver missing: run scripts/services.sh"
ARGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    "--no-first-run", "--disable-background-networking", "--disable-component-update",
    "--disable-sync",
)  # fmt: skip


def start_chromium(width: int = 1280, height: int = 800, *, logs: bool = False) -> Any:
    """A Selenium driver of a new headless Chromium (``FileNotFoundError`` when it is not
    installed); ``logs``: keep the performance and browser logs (what a test reads)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_bin = shutil.which("chromium"), shutil.which("chromedriver")
    if browser is None or driver_bin is None:
        raise FileNotFoundError(MISSING)
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in (*ARGS, f"--window-size={width},{height}"):
        options.add_argument(arg)
    if logs:
        options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(driver_bin))
