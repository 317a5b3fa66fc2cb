"""The held-out replay on the embedded stack, with the real SmolLM2 as judge: a share of the
persona's turns is held out (never judged, never trained); `claw-stream demo` ends by asking
them again of the version serving, scored by the persona's rule with the judge's votes beside
it; the results are in Postgres per version, key and session, and in the report."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path

import asyncpg

from claw_stream.demo.persona import Persona
from claw_stream.demo.run import run_demo

from ..support.stack import Up

ADMIN = "replay-admin-key"
SHARE = "0.5"  # the most a setting allows: enough held-out turns from a few episodes


def _cli(up: Up, *args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    return up.cli(*args, CLAW_DATA_DIR=str(data_dir))


def _stitched(up: Up, n: int, timeout_s: float = 600) -> None:
    """Until the worker recorded `n` turns (held out or not)."""
    deadline = time.monotonic() + timeout_s
    while (found := up.rows("SELECT count(*) AS n FROM turns")[0]["n"]) < n:
        assert time.monotonic() < deadline, f"{found} of {n} turns stitched\n{up.logs()}"
        time.sleep(1)


def test_held_out_turns_never_train_and_the_serving_version_answers_them_again(
    tmp_path: Path,
) -> None:
    up = Up(
        tmp_path / "claw",
        CLAW_ADMIN_KEY=ADMIN,
        CLAW_EVAL__HOLDOUT_SHARE=SHARE,
        CLAW_WORKER__PRM_VOTES="1",  # the real SmolLM2 judges the other turns once
        CLAW_WORKER__JUDGE_MAX_TOKENS="16",
        CLAW_TRAINER__BATCH_SIZE="1000",  # nothing trains: the replay is of v0
        CLAW_TRAINER__MAX_WAIT_S="3600",
    )
    gateway = f"http://127.0.0.1:{up.gateway_port}"
    held_query = "SELECT turn_id, prm_votes FROM judgements WHERE judge_model = 'held-out'"
    try:
        up.wait_ready(240)
        # the persona's turns with a next state are stitched as the conversation goes on
        # (whether a turn is held out is drawn from its random id: another round of episodes
        # where two rounds left fewer than two)
        held: list[asyncpg.Record] = []
        answered, episodes = 0, 0
        for seed in range(3):
            tally = asyncio.run(
                run_demo(gateway, ADMIN, 4, concurrency=4, persona=Persona(30), seed=seed)
            )
            answered, episodes = answered + len(tally.answers), episodes + 4
            # each episode's first answer is a turn once the second is archived
            _stitched(up, answered - episodes)
            held = up.rows(held_query)
            if len(held) >= 2:
                break
        assert held, "no turn was held out"
        assert all(r["prm_votes"] == "[]" for r in held)  # never judged

        demo = _cli(
            up,
            "demo",
            "--episodes",
            "1",
            "--no-held-out",
            "--base-url",
            gateway,
            data_dir=tmp_path / "demo",
        )
        assert demo.returncode == 0, demo.stdout + demo.stderr
        out = demo.stdout
        assert "held-out turns answered again, against the answers the users got" in out, out
        assert "rule:persona" in out
        assert "held-out turns of real conversations, answered again" in out  # the report's

        results = up.rows(
            "SELECT turn_id, version, served_version, scorer, score, rule_score, judge,"
            " judge_score, n_votes, key_hash, answer FROM replay_results"
        )
        held_now = {r["turn_id"] for r in up.rows(held_query)}
        assert results and {r["turn_id"] for r in results} <= held_now
        assert {r["scorer"] for r in results} == {"rule:persona"}
        assert all(r["version"] == 0 and r["served_version"] == 0 for r in results), results
        assert all(r["score"] == r["rule_score"] for r in results)
        assert all(r["key_hash"] for r in results)  # the persona's sessions are keyed
        # the real judge was asked in both orders beside the rule on every pair; a vote counts
        # where its answer named one (SmolLM2-135M mostly reads the options back)
        assert all(r["judge"] == "smollm2-135m" and 0 <= r["n_votes"] <= 2 for r in results)
        assert all((r["judge_score"] is None) == (r["n_votes"] == 0) for r in results)
        # the report measures the judge against the rule, and says whether to trust it
        said = " ".join(out.split())
        assert "the judge smollm2-135m agreed with the rule on" in said, out

        # never trained: no sample of a held-out turn, and the replay's own calls are side calls
        trained = up.rows("SELECT turn_id FROM samples")
        assert not {r["turn_id"] for r in trained} & held_now
        replayed = up.rows("SELECT turn_type, train FROM steps WHERE session_id LIKE 'replay-%'")
        assert len(replayed) >= len(results)
        assert {r["turn_type"] for r in replayed} == {"side"}

        # per version, per key, per session and overall
        levels = up.rows("SELECT level, sum(n_items) AS n FROM replay_by_version GROUP BY level")
        by_level = {r["level"]: r["n"] for r in levels}
        assert by_level == {"all": len(results), "key": len(results), "session": len(results)}

        # the judge alone, as a user without a rule runs it: the same version adds no rows
        alone = _cli(up, "eval", "--replay", "--base-url", gateway, data_dir=tmp_path / "eval")
        assert alone.returncode == 0, alone.stdout + alone.stderr
        assert "held-out turns asked again" in alone.stdout or "judge:" in alone.stdout
        again = up.rows("SELECT count(*) AS n FROM replay_results")
        assert again[0]["n"] == len(results)
    finally:
        code = up.stop(signal.SIGINT)
    assert code == 0, "".join(up.lines)
