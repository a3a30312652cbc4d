"""The console under each kind of token, in real Chromium (issue 15).

A real ingest API on loopback (no worker: streams decode and report state),
and tokens minted with its keys: a viewer's (``streams:read``) sees the table
but no control to change streams, and its live view says why it may not open;
a token that is not a viewer's, an expired one and garbage stay on the login
page with the API's reason; a token that expires while the page is open
returns it to the login page, and the server ends its event stream.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TIMEOUT_FACTOR
from tests.support.browser import artifacts, chromium, console_errors
from tests.support.console import enter_token, open_login, run_with_ingest, sign_in
from tests.support.ingest_api import Ingest

pytestmark = [pytest.mark.integration]


async def test_a_viewer_sees_streams_but_no_controls_to_change_them(tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def check(ingest: Ingest) -> None:
        with chromium() as driver:
            sign_in(driver, ingest, ingest.token("streams:read"))
            wait = WebDriverWait(driver, 30 * TIMEOUT_FACTOR)
            row = '#streams tr[data-stream="cam-1"]'
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, row))
            assert "read only" in driver.find_element(By.ID, "who").text
            assert not driver.find_element(By.ID, "add").is_displayed()
            for action in ("edit", "remove"):
                assert not driver.find_elements(By.CSS_SELECTOR, f'button[data-action="{action}"]')
            driver.save_screenshot(str(artifacts("console") / "viewer-1280x800.png"))
            # the live view needs results:cam-1: the page says so instead of hanging
            driver.find_element(By.CSS_SELECTOR, row + ' button[data-action="view"]').click()
            info = driver.find_element(By.ID, "live-info")
            wait.until(lambda d: "unavailable" in info.text)
            assert "results:cam-1" in info.text, info.text
            assert not console_errors(driver, expected=(403,))

    await run_with_ingest(tmp_path, check)


@pytest.mark.parametrize(
    ("token", "needle"),
    [
        (lambda i: i.token("results:*"), "does not grant 'streams:read'"),
        (lambda i: i.token("streams:read", now=time.time() - 3600), "expired"),
        (lambda i: i.token("streams:read", aud="orchestrator"), "audience"),
        (lambda i: "garbage", "Not signed in"),
    ],
    ids=["not a viewer", "expired", "another service", "garbage"],
)
async def test_a_token_that_is_not_a_viewers_stays_on_the_login_page(
    tmp_path: Path, token: Any, needle: str
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def check(ingest: Ingest) -> None:
        with chromium(390, 844) as driver:
            sign_in(driver, ingest, token(ingest))
            error = driver.find_element(By.ID, "login-error")
            WebDriverWait(driver, 30 * TIMEOUT_FACTOR).until(lambda d: error.text)
            print(f"\n  {error.text}")
            assert needle in error.text and "Not signed in" in error.text
            assert not driver.find_element(By.ID, "app").is_displayed()
            assert "cam-1" not in driver.find_element(By.TAG_NAME, "body").text

    await run_with_ingest(tmp_path, check)


WATCH_LOGIN = """
window.loginHidden = [];
new MutationObserver((records) => records.forEach(
  (r) => window.loginHidden.push(r.oldValue === null))  // no attribute before: now hidden
).observe(document.getElementById("login"),
          {attributes: true, attributeFilter: ["hidden"], attributeOldValue: true});
"""
"""Records each time the login form hides (true: signed in) or shows again (false), so a
signed-in spell is seen however short a slow machine makes it."""


def _signed_in_then_out(driver: Any) -> bool:
    seen: list[bool] = driver.execute_script("return window.loginHidden")
    return True in seen and False in seen[seen.index(True) :]


async def test_a_token_that_expires_returns_the_page_to_its_login(tmp_path: Path) -> None:
    """The token is minted once the login form shows, so loading the page does not use up
    its 4 s; signing in with it takes a request (the API allows 30 s of clock skew past
    its expiry), and the page's event stream ends at the expiry itself."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def check(ingest: Ingest) -> None:
        with chromium() as driver:
            open_login(driver, ingest)
            driver.execute_script(WATCH_LOGIN)
            enter_token(driver, ingest.token("streams:read", ttl=4))
            WebDriverWait(driver, 30 * TIMEOUT_FACTOR).until(_signed_in_then_out)
            assert "expired" in driver.find_element(By.ID, "login-error").text
            assert driver.find_element(By.ID, "login").is_displayed()
            assert not driver.find_element(By.ID, "app").is_displayed()
            stored = driver.execute_script("return sessionStorage.length")
            assert stored == 0  # the token is gone from the tab

    await run_with_ingest(tmp_path, check)
