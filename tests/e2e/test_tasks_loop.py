"""`claw-stream tasks run` on the embedded stack: G attempts per arithmetic task through the
gateway become groups of sessions, rewarded by the checker, that reach the trainer whole and
train in one step with group-normalised rewards. The policy is a tiny model that answers each
task right or wrong with even odds: some groups hold both rewards and train, others one reward
only, which teaches nothing; those are set aside, and tasks are drawn again until two groups
have signal (dynamic sampling)."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import httpx
import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from claw_stream.tasks.checkers import FAIL, PASS
from claw_stream.tasks.dataset import load_tasks
from claw_stream.tasks.tools import tools_of

from ..support.engine import tiny_config, train_to_say
from ..support.model_cache import built
from ..support.processes import child_env, free_port
from ..support.stack import Up

ADMIN = "tasks-admin-key"
N_TASKS, G, SIGNAL = 3, 2, 2


def build_coin_model(folder: Path, smollm2: Path) -> Path:
    """Answers each of the first arithmetic tasks with its right number or a wrong one."""
    tasks = load_tasks("arithmetic", N_TASKS)
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    examples = []
    for task in tasks:
        messages = [{"role": "user", "content": task.prompt}]
        assert task.expected is not None
        examples += [(messages, task.expected), (messages, str(int(task.expected) + 1))]
    schemas = [t.schema for t in tools_of(tasks[0].tools).values()]
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config(len(tokenizer)))
    train_to_say(model, tokenizer, examples, tools=schemas, steps=200)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def coin_model(smollm2: Path) -> Path:
    return built("coin", build_coin_model, smollm2)


async def _rows(port: int, query: str) -> list[dict]:
    conn = await asyncpg.connect(f"postgresql://claw@127.0.0.1:{port}/claw")
    try:
        return [dict(r) for r in await conn.fetch(query)]
    finally:
        await conn.close()


def _wait(probe, what: str, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = probe()
        if result:
            return result
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def test_task_groups_are_rewarded_by_the_checker_and_train_whole(
    coin_model: Path, tmp_path: Path
) -> None:
    up = Up(
        tmp_path / "claw",
        CLAW_ADMIN_KEY=ADMIN,
        CLAW_MODEL=str(coin_model),
        CLAW_WORKER__PRM_VOTES="0",  # the checker's reward is the signal
        CLAW_TRAINER__BATCH_SIZE=str(N_TASKS * G),
        CLAW_TRAINER__MAX_WAIT_S="2",
        CLAW_TRAINER__GROUP_SIZE=str(G),
        CLAW_TRAINER__GROUP_TIMEOUT_S="60",
        # every ready version is evaluated on the same tasks, greedily, as side calls
        CLAW_EVAL__ON_READY="true",
        CLAW_EVAL__DATASET="arithmetic",
        CLAW_EVAL__LIMIT=str(N_TASKS),
        CLAW_EVAL__METRICS_PORT=str(eval_port := free_port()),
    )
    try:
        up.wait_ready(240)
        args = ["--limit", str(N_TASKS), "--group-size", str(G), "--seed", "7", "--max-tokens", "8"]
        args += ["--signal-groups", str(SIGNAL)]
        args += ["--base-url", f"http://127.0.0.1:{up.gateway_port}"]
        run = subprocess.run(
            [sys.executable, "-m", "claw_stream", "tasks", "run", "arithmetic", *args],
            env=child_env(
                CLAW_ADMIN_KEY=ADMIN,
                CLAW_DATA_DIR=str(tmp_path / "cli"),
                CLAW_DATABASE_URL=f"postgresql+asyncpg://claw@127.0.0.1:{up.pg_port}/claw",
                COLUMNS="200",
            ),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert "arith-00" in run.stdout and "per version" in run.stdout
        # it ends with the learning report (the stack's Postgres is reachable from here)
        assert "policy: versions (all sessions)" in run.stdout, run.stdout
        assert (tmp_path / "cli" / "reports" / "report.html").exists()
        run_id = re.search(r"run ([0-9a-f]{8})", run.stdout)
        assert run_id is not None, run.stdout

        steps = _wait(
            lambda: asyncio.run(
                _rows(up.pg_port, "SELECT n_groups, n_samples FROM training_steps ORDER BY step")
            ),
            "a training step",
            240,
        )
        sessions = asyncio.run(
            _rows(
                up.pg_port,
                "SELECT session_id, group_id FROM sessions "
                f"WHERE session_id LIKE '{run_id[1]}-%' ORDER BY session_id",
            )
        )
        groups = {s["group_id"] for s in sessions}
        assert len(sessions) == G * len(groups)
        # the tasks in order, then again (`.1`: the second draw) until two groups had signal
        assert {g.split(".")[0] for g in groups} <= {
            f"{run_id[1]}-arith-{k:02d}" for k in range(N_TASKS)
        }
        assert len(groups) >= SIGNAL

        def samples() -> list[dict] | None:
            rows = asyncio.run(
                _rows(
                    up.pg_port,
                    "SELECT session_id, group_id, reward, trained_in_step, status FROM samples "
                    f"WHERE session_id LIKE '{run_id[1]}-%' "
                    "AND (trained_in_step IS NOT NULL OR status = 'zero_advantage')",
                )
            )
            return rows if len(rows) == len(sessions) else None

        settled = _wait(samples, "every episode's sample trained or set aside", 600)
        # the checker's rewards, as the summary counted them
        assert {r["reward"] for r in settled} <= {PASS, FAIL}
        passed = sum(r["reward"] == PASS for r in settled)
        assert f"{len(sessions)} episodes, {passed} passed" in run.stdout
        by_group: dict[str, list[dict]] = {}
        for r in settled:
            by_group.setdefault(r["group_id"], []).append(r)
        flat = {g for g, rows in by_group.items() if len({r["reward"] for r in rows}) == 1}
        assert f"{len(groups)} groups, {len(flat)} with equal rewards" in run.stdout
        for g, rows in by_group.items():
            if g in flat:  # no signal: set aside, never trained
                assert {r["status"] for r in rows} == {"zero_advantage"}, rows
                assert all(r["trained_in_step"] is None for r in rows)
            else:  # trained whole, in one step that normalised it
                assert len({r["trained_in_step"] for r in rows}) == 1, rows
                assert None not in {r["trained_in_step"] for r in rows}
        assert len(by_group) - len(flat) == SIGNAL, by_group
        assert flat, "every group had signal: seed 7 no longer gives a group to set aside"
        assert sum(s["n_groups"] for s in steps) >= SIGNAL
        events = asyncio.run(
            _rows(
                up.pg_port,
                "SELECT count(*) AS n FROM session_events WHERE kind = 'ended' "
                f"AND session_id LIKE '{run_id[1]}-%'",
            )
        )
        assert events[0]["n"] == len(sessions)

        # the evaluator scored version 0 at start and the trained version once it was ready
        def evaluated() -> list[dict] | None:
            rows = asyncio.run(
                _rows(up.pg_port, "SELECT version, score, n_episodes FROM eval_scores")
            )
            whole = [r for r in rows if r["version"] >= 1 and r["n_episodes"] == N_TASKS]
            return rows if whole else None

        # (a version swapped in during a run is scored on part of the set, then on all of it)
        scores = _wait(evaluated, "a whole eval of the trained version", 600)
        assert {r["version"] for r in scores} >= {0, 1}
        assert all(1 <= r["n_episodes"] <= N_TASKS and 0 <= r["score"] <= 1 for r in scores)
        metrics = httpx.get(f"http://127.0.0.1:{eval_port}/metrics").text
        assert 'claw_eval_score{dataset="arithmetic",policy="policy"}' in metrics
        # eval calls are archived side turns: none became a sample
        eval_samples = asyncio.run(
            _rows(up.pg_port, "SELECT count(*) AS n FROM samples WHERE session_id LIKE 'eval-%'")
        )
        assert eval_samples[0]["n"] == 0
        eval_steps = asyncio.run(
            _rows(
                up.pg_port,
                "SELECT count(*) AS n FROM steps WHERE session_id LIKE 'eval-%' "
                "AND turn_type = 'side'",
            )
        )
        assert eval_steps[0]["n"] >= 2 * N_TASKS

        # a one-off eval from the command line prints and records the served version
        cli = ["eval", "--dataset", "arithmetic", "--limit", "2"]
        cli.append(f"--base-url=http://127.0.0.1:{up.gateway_port}")
        one = subprocess.run(
            [sys.executable, "-m", "claw_stream", *cli],
            env=child_env(
                CLAW_ADMIN_KEY=ADMIN,
                CLAW_DATA_DIR=str(tmp_path / "cli"),
                CLAW_DATABASE_URL=f"postgresql+asyncpg://claw@127.0.0.1:{up.pg_port}/claw",
                COLUMNS="200",
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert one.returncode == 0, one.stdout + one.stderr
        assert "arithmetic" in one.stdout and "eval" in one.stdout
        # each evaluated version's tasks, one row each, paired by the report item by item
        held = asyncio.run(
            _rows(up.pg_port, "SELECT source, version, item, score FROM held_out_results")
        )
        assert {r["source"] for r in held} == {"tasks:arithmetic"}
        assert {r["version"] for r in held} >= {0, 1}
        assert {r["item"] for r in held} <= {f"arith-{k:02d}#0" for k in range(N_TASKS)}
        assert {r["score"] for r in held} <= {0.0, 1.0}
    finally:
        code = up.stop(signal.SIGINT)
    assert code == 0, "".join(up.lines)
