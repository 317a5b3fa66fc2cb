"""A real headless browser for the pages: Debian's `chromium`, driven through
`chromium-driver` (selenium). Without them a page test is skipped, except where
CLAW_REQUIRE_CHROMIUM is set (CI installs both and sets it)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver


@contextmanager
def headless_chromium(log: Path) -> Iterator[WebDriver]:
    """A Chromium session; chromedriver's log goes to `log`."""
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        why = "Debian's chromium and chromium-driver are needed: apt-get install chromium "
        why += "chromium-driver"
        if os.environ.get("CLAW_REQUIRE_CHROMIUM"):
            pytest.fail(why)
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument("--window-size=1280,1600")
    driver = webdriver.Chrome(service=Service(driver_path, log_output=str(log)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def follow(browser: WebDriver, element: Any) -> None:
    """Click a link or a form's button and wait for the page it leads to (a click returns
    before the navigation it starts: the old page could be read instead). While the old page
    goes, chromedriver may answer "Node with given id does not belong to the document"
    instead of a stale element (a fresh-clone run met it): that is the wait's end coming."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.expected_conditions import staleness_of
    from selenium.webdriver.support.ui import WebDriverWait

    page = browser.find_element(By.TAG_NAME, "html")
    element.click()
    WebDriverWait(browser, 30, ignored_exceptions=(WebDriverException,)).until(staleness_of(page))
