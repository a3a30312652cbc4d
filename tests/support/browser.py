"""Real Chromium (Debian's ``chromium`` + ``chromium-driver``), headless and offline.

Every host name but 127.0.0.1 resolves to nothing, so a page that reaches for a CDN
fails visibly; :func:`requested_urls` lists what the page asked for.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from bench.rig.browser import start_chromium

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def chromium(width: int = 1280, height: int = 800) -> Iterator[Any]:
    try:
        driver = start_chromium(width, height, logs=True)
    except FileNotFoundError as exc:
        pytest.fail(str(exc))
    try:
        yield driver
    finally:
        driver.quit()


def requested_urls(driver: Any) -> list[str]:
    """Every URL the page requested, less those the page's CSP blocked before sending."""
    sent, blocked = {}, set()
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        params = message["params"]
        if message["method"] == "Network.requestWillBeSent":
            sent[params["requestId"]] = params["request"]["url"]
        elif message["method"] == "Network.loadingFailed" and params.get("blockedReason") == "csp":
            blocked.add(params["requestId"])
    return [url for rid, url in sent.items() if rid not in blocked]


def console_errors(driver: Any, expected: tuple[int, ...] = ()) -> list[str]:
    """The page's JavaScript errors and failed loads (SEVERE browser log entries), less
    answers with an ``expected`` HTTP status (a refusal the test asked for)."""
    said = [f"the server responded with a status of {code} " for code in expected]
    return [e["message"] for e in driver.get_log("browser")
            if e["level"] == "SEVERE" and not any(s in e["message"] for s in said)]  # fmt: skip


def artifacts(name: str) -> Path:
    """A folder for files a test leaves for people to look at (screenshots):
    ``$FRAMERELAY_TEST_ARTIFACTS/<name>``, else ``test-artifacts/<name>`` in the repository."""
    base = Path(os.environ.get("FRAMERELAY_TEST_ARTIFACTS") or ROOT / "test-artifacts")
    folder = base / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder
