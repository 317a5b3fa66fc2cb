"""The whole loop on the embedded stack, watched in the console in a real headless Chromium.

Episodes through the gateway with the `openai` client become Steps, turns, judgements (the real
SmolLM2 as judge) and samples; the trainer steps; the engines serve the new versions; later
Steps carry them. In the console: log in with the link `up` prints, see a session's turns with
the judge's votes, switch it off training and see the trainer withdraw its samples, label a
turn, roll back a version from the Versions page, forget the session. Without the admin key
every console route is 401; a session's key gets 403. `claw-stream stats` and `claw-stream
report` then show it all from Postgres."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from selenium.webdriver.common.by import By

from claw_stream.demo.persona import Persona
from claw_stream.demo.run import run_demo

from ..support.browser import follow, headless_chromium
from ..support.paths import REPO
from ..support.processes import child_env
from ..support.stack import Up

ADMIN = "console-admin-key"
SHOTS = REPO / "docs" / "console"  # CLAW_UPDATE_SCREENSHOTS=1 writes the docs' here


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


def test_episodes_train_versions_that_the_console_shows_switches_off_and_rolls_back(
    tmp_path: Path,
) -> None:
    up = Up(
        tmp_path / "claw",
        CLAW_ADMIN_KEY=ADMIN,
        CLAW_WORKER__PRM_VOTES="1",  # the real SmolLM2 judges the turns: votes to show
        CLAW_WORKER__JUDGE_MAX_TOKENS="16",
        CLAW_TRAINER__BATCH_SIZE="3",  # 6 samples: v1 and v2; 2 more wait for a third
        CLAW_TRAINER__MAX_WAIT_S="600",
        CLAW_CONSOLE__TURNS_PER_PAGE="1",  # the session's two turns on two pages
    )
    gateway = f"http://127.0.0.1:{up.gateway_port}"
    try:
        up.wait_ready(240)
        output = "".join(up.lines)
        assert f"base URL: {gateway}/v1" in output and "session key: claw-sk-" in output
        assert "from openai import OpenAI" in output
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
        first = asyncio.run(run_demo(gateway, ADMIN, 3, concurrency=3, persona=Persona(30)))
        assert len(first.answers) == 6 and min(a.version for a in first.answers) == 0
        _wait(
            lambda: up.rows("SELECT 1 FROM weight_versions WHERE version = 2 AND status = 'ready'"),
            "v2 ready",
            400,
            up,
        )
        served = httpx.get(f"http://127.0.0.1:{up.engine_port}/v1/models").json()["data"][0]
        assert served["weight_version"] == 2
        # one more episode, answered by v2: its two samples wait in the trainer for a third
        later = asyncio.run(run_demo(gateway, ADMIN, 1, persona=Persona(30), seed=7))
        assert {a.version for a in later.answers} == {2}
        waiting = _wait(
            lambda: up.rows(
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
            lambda: up.rows(
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
            assert "(serving)" in browser.find_element(By.ID, "history").text
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
            follow(browser, browser.find_element(By.LINK_TEXT, session))
            assert browser.find_element(By.TAG_NAME, "h1").text == f"Session {session}"
            turns = browser.find_elements(By.CSS_SELECTOR, ".turn")
            assert len(turns) == 1 and "turn 0," in turns[0].text
            assert browser.find_elements(By.CSS_SELECTOR, ".vote"), "no vote shown"
            assert "waiting for the trainer" in turns[0].text
            assert "turns 1 to 1 of 2" in browser.find_element(By.CLASS_NAME, "pager").text
            assert not browser.find_elements(By.ID, "earlier-top")
            _shot(browser, tmp_path, "session")
            # the next page: the other turn
            follow(browser, browser.find_element(By.ID, "later-bottom"))
            (second,) = browser.find_elements(By.CSS_SELECTOR, ".turn")
            assert "turn 1," in second.text and "waiting for the trainer" in second.text
            assert not browser.find_elements(By.ID, "later-top")
            follow(browser, browser.find_element(By.ID, "earlier-top"))

            follow(browser, browser.find_element(By.ID, "switch"))
            assert "switched off" in browser.find_element(By.ID, "said").text
            assert browser.find_element(By.ID, "training").text == "off"
            # a third sample comes: the trainer takes the batch and withdraws the two
            asyncio.run(run_demo(gateway, ADMIN, 1, persona=Persona(30), seed=11))
            _wait(
                lambda: (
                    len(
                        up.rows(
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
            statuses = []
            for page in (1, 0):  # the label below is on the first page's turn
                browser.get(f"{gateway}/console/sessions/{session}?page={page}")
                samples = browser.find_elements(By.CSS_SELECTOR, ".sample")
                statuses += [s.text.split(", ")[-1] for s in samples]
            assert statuses == ["withdrawn", "withdrawn"]

            # a label is feedback on that turn's step, through /rl/feedback (after the switch:
            # a label taken in before it would make a third sample that fills the batch)
            turn = browser.find_elements(By.CSS_SELECTOR, ".turn")[0]
            first_step = turn.get_attribute("id").removeprefix("step-")
            follow(browser, turn.find_element(By.CSS_SELECTOR, "button.good"))
            assert "labelled good" in browser.find_element(By.ID, "said").text
            _wait(
                lambda: up.rows(
                    "SELECT 1 FROM session_events WHERE kind = 'feedback' AND score = 1"
                    " AND step_id = $1::uuid",
                    first_step,
                ),
                "the label archived as feedback",
                60,
                up,
            )

            # any three of the four samples hold at most the two withdrawn: the step trains
            # the rest, and v3 comes. Waiting for less let the rollback below land while v3
            # trained, and v3's push then served it over v1 (seen beside a one-core burner).
            newest = _wait(
                lambda: up.rows(
                    "SELECT max(version) FILTER (WHERE status = 'ready') AS v"
                    " FROM weight_versions HAVING NOT bool_or(status = 'updating')"
                    " AND max(version) FILTER (WHERE status = 'ready') = 3",
                ),
                "v3 ready, no version being pushed",
                300,
                up,
            )[0]["v"]
            browser.get(gateway + "/console/versions")
            serving = browser.find_elements(By.XPATH, "//tr[contains(., '(serving)')]")
            assert [r.get_attribute("id") for r in serving] == [f"v{newest}"]
            _shot(browser, tmp_path, "versions")
            v1 = browser.find_element(By.ID, "v1")
            v1.find_element(By.NAME, "reason").send_keys("checked from the console")
            follow(browser, v1.find_element(By.CSS_SELECTOR, "button.serve"))
            said = browser.find_element(By.ID, "said").text
            assert f"serving v1 (was v{newest})" in said, said
            assert "v1 (serving)" in browser.find_element(By.ID, "v1").text

            # forget: only with its id typed, then gone from every table
            browser.get(f"{gateway}/console/sessions/{session}")
            follow(browser, browser.find_element(By.ID, "forget"))
            assert "type the session id" in browser.find_element(By.ID, "error").text
            browser.find_element(By.ID, "confirm").send_keys(session)
            follow(browser, browser.find_element(By.ID, "forget"))
            assert f"{session} forgotten" in browser.find_element(By.ID, "said").text
            assert session not in browser.find_element(By.ID, "sessions").text
        rolled = up.rows("SELECT rolled_back_from, reason FROM weight_versions WHERE version = 1")
        assert (rolled[0]["rolled_back_from"], rolled[0]["reason"]) == (
            newest,
            "checked from the console",
        )
        served = httpx.get(f"http://127.0.0.1:{up.engine_port}/v1/models").json()["data"][0]
        assert served["weight_version"] == 1
        assert not up.rows("SELECT 1 FROM steps WHERE session_id = $1", session)

        # the store has all of it: every answer archived, judged by SmolLM2, trained
        counts = dict(
            up.rows(
                "SELECT (SELECT count(*) FROM steps WHERE weight_version >= 2) AS new_steps,"
                " (SELECT count(*) FROM judgements WHERE jsonb_array_length(prm_votes) = 1)"
                "   AS judged,"
                " (SELECT count(*) FROM training_steps) AS trained,"
                " (SELECT count(*) FROM samples WHERE trained_in_step >= 1) AS samples_trained",
            )[0]
        )
        assert counts["new_steps"] >= 2 and counts["judged"] >= 3, counts
        assert counts["trained"] >= 2 and counts["samples_trained"] >= 6, counts
        env = child_env(
            CLAW_DATABASE_URL=f"postgresql+asyncpg://claw@127.0.0.1:{up.pg_port}/claw",
            COLUMNS="220",
        )
        stats = subprocess.run(
            [sys.executable, "-m", "claw_stream", "stats"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert stats.returncode == 0, stats.stderr
        assert "reward per version" in stats.stdout and "training curve" in stats.stdout
        # the learning report: v2 answered the later episode, so the first thumbs' wait for a
        # version trained on them ends there; the rollback and its reason are in it
        report = subprocess.run(
            [sys.executable, "-m", "claw_stream", "report", "--out", str(tmp_path / "report")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert report.returncode == 0, report.stdout + report.stderr
        said = " ".join(report.stdout.split())
        assert "policy: versions (all sessions)" in said, report.stdout
        versions = [line for line in report.stdout.splitlines() if line.startswith("│ v")]
        assert [v.split()[1] for v in versions[:3]] == ["v0", "v1", "v2"], report.stdout
        assert "feedback → the first answer of a version trained on it: p50" in said
        assert f"rolled back from v{newest}: checked from the console" in said
        assert "no held-out scores yet" in said  # these episodes scored none
        assert (tmp_path / "report" / "report.html").stat().st_size > 10_000
    finally:
        code = up.stop(signal.SIGINT)
    assert code == 0, "".join(up.lines)
