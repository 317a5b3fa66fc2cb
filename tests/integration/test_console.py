"""The console in a real headless Chromium, on `claw-stream up` after a demo run: log in with the
link `up` prints, see a session's turns with the judge's votes, switch it off training and see
the trainer withdraw its samples, roll back a version from the Versions page. Without the admin
key every console route is 401; a session's key gets 403."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from selenium.webdriver.common.by import By

from claw_stream.demo.persona import Persona
from claw_stream.demo.run import run_demo

from ..support.browser import headless_chromium
from ..support.paths import REPO
from ..support.stack import Up

pytestmark = pytest.mark.slow
ADMIN = "console-admin-key"
SHOTS = REPO / "docs" / "console"  # CLAW_UPDATE_SCREENSHOTS=1 writes the README's here


def _rows(up: Up, query: str, *args: Any) -> list[asyncpg.Record]:
    async def fetch() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(f"postgresql://claw@127.0.0.1:{up.pg_port}/claw")
        try:
            return list(await conn.fetch(query, *args))
        finally:
            await conn.close()

    return asyncio.run(fetch())


def _wait(probe: Callable[[], Any], what: str, timeout_s: float, up: Up) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(1)
    logs = "\n".join(
        f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((up.data_dir / "logs").glob("*"))
    )
    raise AssertionError(f"timed out waiting for {what}\n{logs}")


def _shot(browser: Any, tmp: Path, name: str) -> None:
    path = tmp / f"{name}.png"
    browser.save_screenshot(str(path))
    if os.environ.get("CLAW_UPDATE_SCREENSHOTS"):
        SHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, SHOTS / path.name)


def test_the_console_shows_a_session_switches_it_off_and_rolls_back(tmp_path: Path) -> None:
    up = Up(
        tmp_path / "claw",
        CLAW_ADMIN_KEY=ADMIN,
        CLAW_WORKER__PRM_VOTES="1",  # the real SmolLM2 judges the turns: votes to show
        CLAW_WORKER__JUDGE_MAX_TOKENS="16",
        CLAW_TRAINER__BATCH_SIZE="3",  # 6 samples: v1 and v2; 2 more wait for a third
        CLAW_TRAINER__MAX_WAIT_S="600",
    )
    gateway = f"http://127.0.0.1:{up.gateway_port}"
    try:
        up.wait_ready(240)
        login = next(line for line in up.lines if "/console/login?key=" in line).split()[-1]
        assert login == f"{gateway}/console/login?key={ADMIN}"

        # who may look: nobody without the admin key, not a session's own key
        key = httpx.post(
            f"{gateway}/rl/start_session", headers={"Authorization": f"Bearer {ADMIN}"}, json={}
        ).json()["api_key"]
        for path in ("/console", "/console/sessions", "/console/versions", "/console/curve.png"):
            assert httpx.get(gateway + path).status_code == 401, path
            assert (
                httpx.get(gateway + path, headers={"Authorization": "Bearer x"}).status_code == 401
            )
            mine = httpx.get(gateway + path, headers={"Authorization": f"Bearer {key}"})
            assert mine.status_code == 403, path
        for path in ("/console/sessions/s/train", "/console/versions/1/serve"):
            assert httpx.post(gateway + path, data={"enabled": "false"}).status_code == 401
            assert (
                httpx.post(gateway + path, headers={"Authorization": f"Bearer {key}"}).status_code
                == 403
            )

        # three episodes: six thumbs, two trainer steps of three, v1 and v2
        asyncio.run(run_demo(gateway, ADMIN, 3, concurrency=3, persona=Persona(30)))
        _wait(
            lambda: _rows(
                up, "SELECT 1 FROM weight_versions WHERE version = 2 AND status = 'ready'"
            ),
            "v2 ready",
            400,
            up,
        )
        # one more episode: its two samples wait in the trainer for a third
        asyncio.run(run_demo(gateway, ADMIN, 1, persona=Persona(30), seed=7))
        waiting = _wait(
            lambda: _rows(
                up,
                "SELECT session_id FROM samples GROUP BY session_id"
                " HAVING count(*) = 2 AND bool_and(status = 'published')"
                " AND bool_and(trained_in_step IS NULL)",
            ),
            "an episode's samples published, not trained",
            120,
            up,
        )
        session = waiting[0]["session_id"]
        _wait(
            lambda: _rows(
                up,
                "SELECT 1 FROM judgements WHERE session_id = $1"
                " AND jsonb_array_length(prm_votes) > 0",
                session,
            ),
            "its first turn judged",
            120,
            up,
        )

        with headless_chromium(tmp_path / "chromedriver.log") as browser:
            browser.get(gateway + "/console")
            assert "log in with the admin key" in browser.find_element(By.ID, "refused").text
            browser.get(login)  # the key becomes a cookie, the address loses it
            assert browser.current_url == gateway + "/console"
            services = browser.find_element(By.ID, "services").text
            for name in ("engine", "gateway", "worker", "trainer", "postgres", "broker"):
                assert name in services
            assert "down" not in services, services
            assert "v2 (serving)" in browser.find_element(By.ID, "history").text
            assert (
                browser.execute_script(
                    "const img = document.getElementById('curve'); return img ? img.naturalWidth : 0"
                )
                > 400
            )
            _shot(browser, tmp_path, "overview")

            browser.get(gateway + "/console/sessions")
            rows = browser.find_elements(By.CSS_SELECTOR, "#sessions tbody tr")
            assert len(rows) >= 5  # four episodes and the session started above
            _shot(browser, tmp_path, "sessions")
            browser.find_element(By.LINK_TEXT, session).click()
            assert browser.find_element(By.TAG_NAME, "h1").text == f"Session {session}"
            turns = browser.find_elements(By.CSS_SELECTOR, ".turn")
            assert len(turns) == 2
            assert browser.find_elements(By.CSS_SELECTOR, ".vote"), "no vote shown"
            assert "waiting for the trainer" in turns[0].text
            _shot(browser, tmp_path, "session")

            browser.find_element(By.ID, "switch").click()
            assert "switched off" in browser.find_element(By.ID, "said").text
            assert browser.find_element(By.ID, "training").text == "off"
            # a third sample comes: the trainer takes the batch and withdraws the two
            asyncio.run(run_demo(gateway, ADMIN, 1, persona=Persona(30), seed=11))
            _wait(
                lambda: (
                    len(
                        _rows(
                            up,
                            "SELECT 1 FROM samples WHERE session_id = $1 AND status = 'withdrawn'",
                            session,
                        )
                    )
                    == 2
                ),
                "the trainer withdrew its samples",
                180,
                up,
            )
            browser.refresh()
            samples = browser.find_elements(By.CSS_SELECTOR, ".sample")
            assert [s.text.split(", ")[-1] for s in samples] == ["withdrawn", "withdrawn"]

            browser.get(gateway + "/console/versions")
            assert "v2 (serving)" in browser.find_element(By.ID, "v2").text
            _shot(browser, tmp_path, "versions")
            v1 = browser.find_element(By.ID, "v1")
            v1.find_element(By.NAME, "reason").send_keys("checked from the console")
            v1.find_element(By.CSS_SELECTOR, "button.serve").click()
            assert "serving v1 (was v2)" in browser.find_element(By.ID, "said").text
            assert "v1 (serving)" in browser.find_element(By.ID, "v1").text
        rolled = _rows(up, "SELECT rolled_back_from, reason FROM weight_versions WHERE version = 1")
        assert (rolled[0]["rolled_back_from"], rolled[0]["reason"]) == (
            2,
            "checked from the console",
        )
        served = httpx.get(f"http://127.0.0.1:{up.engine_port}/v1/models").json()["data"][0]
        assert served["weight_version"] == 1
    finally:
        code = up.stop(signal.SIGINT)
    assert code == 0, "".join(up.lines)
