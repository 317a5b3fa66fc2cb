"""The whole loop on the embedded stack: episodes through the gateway with the `openai` client
become Steps, turns, judgements and samples; the trainer steps; the engine serves the new
version; later Steps carry it; Postgres and `claw-stream stats` show all of it."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import httpx
import pytest

from claw_stream.demo.persona import Persona
from claw_stream.demo.run import run_demo

from ..support.processes import child_env
from ..support.stack import Up

pytestmark = pytest.mark.slow
ADMIN = "loop-admin-key"


async def _rows(port: int, query: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(f"postgresql://claw@127.0.0.1:{port}/claw")
    try:
        return await conn.fetch(query)
    finally:
        await conn.close()


def _wait(probe, what: str, timeout_s: float) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = probe()
        if result:
            return result
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def test_episodes_train_a_new_version_that_serves_later_steps(tmp_path: Path) -> None:
    up = Up(
        tmp_path / "claw",
        CLAW_ADMIN_KEY=ADMIN,
        CLAW_WORKER__PRM_VOTES="1",  # the real SmolLM2 judges each turn once
        CLAW_WORKER__JUDGE_MAX_TOKENS="16",
        CLAW_TRAINER__BATCH_SIZE="4",
        CLAW_TRAINER__MAX_WAIT_S="3",
    )
    gateway = f"http://127.0.0.1:{up.gateway_port}"
    try:
        up.wait_ready(240)
        output = "".join(up.lines)
        assert f"base URL: {gateway}/v1" in output and "session key: claw-sk-" in output
        assert "from openai import OpenAI" in output

        first = asyncio.run(run_demo(gateway, ADMIN, 3, concurrency=3, persona=Persona(30)))
        assert len(first.answers) == 6 and min(a.version for a in first.answers) == 0
        # a partial batch trains after 3 s, so on a slow machine the first turns' samples can
        # push v1 before the last answers of this round (seen on CI): those answers count
        served_new = sum(a.version >= 1 for a in first.answers)

        def ready_version() -> int:
            rows = asyncio.run(
                _rows(
                    up.pg_port,
                    "SELECT max(version) AS v FROM weight_versions WHERE status = 'ready'",
                )
            )
            return rows[0]["v"] or 0

        version = _wait(ready_version, "a trained version ready", 300)
        assert version >= 1
        served = httpx.get(f"http://127.0.0.1:{up.engine_port}/v1/models").json()["data"][0]
        assert served["weight_version"] >= 1

        later = asyncio.run(run_demo(gateway, ADMIN, 1, persona=Persona(30), seed=1))
        assert min(a.version for a in later.answers) >= 1

        query = (
            "SELECT (SELECT count(*) FROM steps) AS steps,"
            " (SELECT count(*) FROM steps WHERE weight_version >= 1) AS new_steps,"
            " (SELECT count(*) FROM turns) AS turns,"
            " (SELECT count(*) FROM judgements WHERE jsonb_array_length(prm_votes) = 1)"
            "   AS judged,"
            " (SELECT count(*) FROM samples WHERE status = 'published') AS samples,"
            " (SELECT count(*) FROM training_steps) AS trained,"
            " (SELECT count(*) FROM samples WHERE trained_in_step >= 1) AS samples_trained"
        )

        def archived() -> dict | None:  # the worker archives a moment after the answers
            row = dict(asyncio.run(_rows(up.pg_port, query))[0])
            return row if row["steps"] == 8 and row["samples"] >= 6 else None

        counts = _wait(archived, "every step archived", 120)
        assert counts["new_steps"] == 2 + served_new
        # every answer got thumbs, so every turn of a finished episode is a sample
        assert counts["turns"] >= 6 and counts["trained"] >= 1
        assert counts["samples_trained"] >= 1  # the trainer says which step trained each
        assert counts["judged"] >= 3  # turns with a next state were judged by SmolLM2

        stats = subprocess.run(
            [sys.executable, "-m", "claw_stream", "stats"],
            env=child_env(
                CLAW_DATABASE_URL=f"postgresql+asyncpg://claw@127.0.0.1:{up.pg_port}/claw",
                COLUMNS="200",
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert stats.returncode == 0, stats.stderr
        assert "reward per version" in stats.stdout and "training curve" in stats.stdout

        # the learning report: v1 answered the later episode, so the first thumbs' wait for a
        # version trained on them ends there
        report = subprocess.run(
            [sys.executable, "-m", "claw_stream", "report", "--out", str(tmp_path / "report")],
            env=child_env(
                CLAW_DATABASE_URL=f"postgresql+asyncpg://claw@127.0.0.1:{up.pg_port}/claw",
                COLUMNS="220",
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert report.returncode == 0, report.stdout + report.stderr
        assert "policy: versions (all sessions)" in report.stdout, report.stdout
        versions = [line for line in report.stdout.splitlines() if line.startswith("│ v")]
        assert versions[0].startswith("│ v0") and versions[1].startswith("│ v1"), report.stdout
        assert "feedback → the first answer of a version trained on it: p50" in report.stdout
        assert "no held-out scores yet" in report.stdout  # these episodes scored none
        assert (tmp_path / "report" / "report.html").stat().st_size > 10_000
    finally:
        code = up.stop(signal.SIGINT)
    assert code == 0, "".join(up.lines)
