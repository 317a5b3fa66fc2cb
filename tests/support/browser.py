"""A real headless browser for the pages: Debian's `chromium`, driven through
`chromium-driver` (selenium). Without them a page test is skipped, except where
CLAW_REQUIRE_CHROMIUM is set (CI installs both and sets it)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

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
