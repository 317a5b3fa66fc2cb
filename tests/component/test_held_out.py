"""The demo's held-out questions on a real gateway and engine: side calls of a session whose
training is off, the same answer for the same version (seeded), scored by the persona's rule."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
from selenium.webdriver.common.by import By

from claw_stream.demo.held_out import HELD_OUT_QUESTIONS, HeldOut
from claw_stream.demo.persona import QUESTIONS, Persona
from claw_stream.demo.tally import Tally

from ..support.browser import headless_chromium
from ..support.engine import ADMIN_KEY
from ..support.gateway import GatewayProcess, read_steps
from ..support.processes import child_env


async def _score(gateway: GatewayProcess, tally: Tally, questions: list[str]) -> str:
    # one call at a time: the engine then batches nothing, so a seed gives the same draw
    async with HeldOut(
        gateway.base_url, ADMIN_KEY, "policy", Persona(30), tally, questions, concurrency=1
    ) as held:
        await held.score()
        await held.score()  # the same version again: its set is kept once
        assert held.session_id is not None
        return held.session_id


def test_held_out_questions_are_side_calls_that_never_train(gateway: GatewayProcess) -> None:
    assert not set(HELD_OUT_QUESTIONS) & set(QUESTIONS)  # never asked in an episode
    assert len(HELD_OUT_QUESTIONS) >= 20
    questions = HELD_OUT_QUESTIONS[:5]
    first, again = Tally(), Tally()
    sessions = [asyncio.run(_score(gateway, t, questions)) for t in (first, again)]

    assert list(first.held_out) == [0]  # one complete set, of the version serving
    answers = first.held_out[0]
    assert [a.question for a in answers] == list(range(5))
    assert all(a.short == Persona(30).is_short(" ".join(["w"] * a.words)) for a in answers)
    # seeded: the same version answers each question alike, so versions differ by weights only
    assert [a.words for a in answers] == [a.words for a in again.held_out[0]]
    curve = first.held_out_curve()
    assert len(curve) == 1 and curve[0].passed.n == 5 and curve[0].against_first is None

    steps = read_steps(gateway.bootstrap, set(sessions))
    assert len(steps) == 2 * (5 + 5)
    assert {s.session_id for s in steps} == set(sessions) and sessions[0] != sessions[1]
    assert all(s.turn_type == "side" and not s.train for s in steps)


def test_the_demo_scores_the_served_version_on_the_held_out_set(
    gateway: GatewayProcess, database: str, tmp_path: Path
) -> None:
    """`claw-stream demo` as a user runs it: episodes, the held-out set before and after,
    the tables, the verdict and the plot (no trainer here: one version, nothing to compare);
    then the learning report, its held-out set kept in Postgres, and its page in Chromium."""
    plot = tmp_path / "demo.png"
    policy = f"demo-{uuid.uuid4().hex[:6]}"  # its own policy in the session's shared database
    env = child_env(
        CLAW_ADMIN_KEY=ADMIN_KEY,
        CLAW_DATA_DIR=str(tmp_path),
        CLAW_DATABASE_URL=database,
        CLAW_POLICY_NAME=policy,
        COLUMNS="200",
    )
    args = ["--episodes", "2", "--concurrency", "2", "--base-url", gateway.base_url]
    run = subprocess.run(
        [sys.executable, "-m", "claw_stream", "demo", *args, "--plot", str(plot)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "live answers per version" in run.stdout
    assert "held-out questions per version" in run.stdout and "(baseline)" in run.stdout
    assert "only one version answered the held-out questions" in run.stdout
    assert plot.read_bytes()[:4] == b"\x89PNG"

    # the held-out set is kept, one row per question, whatever the demo printed
    rows = asyncio.run(_held_out_rows(database, policy))
    assert [(r["source"], r["version"]) for r in rows] == [("persona", 0)] * len(HELD_OUT_QUESTIONS)
    assert [r["item"] for r in rows] == [f"q{i:02d}" for i in range(len(HELD_OUT_QUESTIONS))]
    assert {r["session_id"] for r in rows} != {None}
    # the demo ends with the learning report: its table, and its page
    assert f"{policy}: versions" in run.stdout and "held-out: persona" in run.stdout
    page = tmp_path / "reports" / "report.html"
    assert f"report: {page}" in run.stdout.replace("\n", "")
    with headless_chromium(tmp_path / "chromedriver.log") as browser:
        browser.get(page.as_uri())
        width = browser.execute_script(
            "const img = document.getElementById('plot');"
            " return img.complete ? img.naturalWidth : 0;"
        )
        assert width > 400  # the plot decoded, inlined in the page
        versions = browser.find_elements(By.CSS_SELECTOR, "#versions tbody tr")
        assert versions and versions[0].text.startswith("v0")
        held = browser.find_elements(By.CSS_SELECTOR, "table.held-out tbody tr")
        assert [r.text.split()[:2] for r in held] == [["v0", str(len(HELD_OUT_QUESTIONS))]]
        assert "Held-out: persona" in browser.find_element(By.TAG_NAME, "body").text


async def _held_out_rows(database: str, policy: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(database.replace("+asyncpg", ""))
    try:
        return list(
            await conn.fetch(
                "SELECT source, version, item, session_id FROM held_out_results"
                " WHERE policy = $1 ORDER BY item",
                policy,
            )
        )
    finally:
        await conn.close()
