"""The documentation site as a reader opens it: `mkdocs build --strict` (what `make docs` runs)
builds it, and a real headless Chromium opens the home page and a reference page over HTTP."""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from ..support.browser import headless_chromium
from ..support.paths import REPO


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(out))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_the_home_page_opens_with_its_navigation(site: str, tmp_path: Path) -> None:
    with headless_chromium(tmp_path / "chromedriver.log") as browser:
        browser.get(site + "/")
        assert browser.title.startswith("claw-stream")
        nav = browser.find_element(By.CSS_SELECTOR, "nav.md-nav--primary").get_attribute(
            "textContent"
        )
        for section in ("Getting started", "Agents", "Concepts", "Operations", "Reference"):
            assert section in nav, section
        # a link of the navigation leads to its page
        browser.get(site + "/getting-started/")
        assert "make up" in browser.find_element(By.TAG_NAME, "article").text


def test_the_settings_reference_shows_each_setting_and_its_variable(
    site: str, tmp_path: Path
) -> None:
    with headless_chromium(tmp_path / "chromedriver.log") as browser:
        browser.get(site + "/reference/settings/")
        rows = browser.find_elements(By.CSS_SELECTOR, "article table tbody tr")
        cells = [r.find_elements(By.TAG_NAME, "td") for r in rows]
        by_setting = {c[0].text: c[1].text for c in cells if len(c) >= 2}
        assert by_setting["gateway.port"] == "CLAW_GATEWAY__PORT"
        assert len(by_setting) > 100
