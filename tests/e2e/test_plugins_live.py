"""Reward and loss plugins in the real pipeline: a Faust worker on the real broker and Postgres
scores turns with a user's rule (per-session ground truth), a user's HTTP service and the PRM
judge; replay re-judges the recorded traffic with another rule into a new topic and the real
trainer (DeepSpeed, a tiny model) learns from it with a user's loss."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import torch

from claw_stream.events import ChatMessage, DeadLetter, Judgement, Sample, SessionEvent, Step
from claw_stream.store.db import asyncpg_dsn
from claw_stream.trainer.config import LossConfig
from claw_stream.trainer.losses import advantages, normalise_rewards

from ..support.engine import ADMIN_KEY, EngineProcess
from ..support.processes import child_env, free_port
from ..support.scoring_service import Callback
from ..support.worker import (
    JudgeStub,
    WorkerEnv,
    events_on,
    new_id,
    private_worker,
    step,
    wait_for,
)

PLUGINS = "tests.support.user_plugins"
MATH = {"name": "answer", "use": "rule", "function": f"{PLUGINS}:exact_answer"}
QUESTION = [ChatMessage(role="user", content="What is 6 * 7?")]


@pytest.fixture(scope="module")
def service() -> Any:
    server = Callback()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def env(broker, postgres, service: Callback, tmp_path_factory) -> Any:
    judge = JudgeStub(slow_s=20)
    rewards = [
        MATH,
        {"name": "ci", "use": "external", "url": service.url, "timeout_s": 1},
        {"use": "prm"},
    ]
    worker, topics, url = asyncio.run(
        private_worker(
            broker,
            postgres,
            tmp_path_factory.mktemp("plugins"),
            "plugins",
            judge_url=judge.url,
            judge_timeout_s=2,
            judge_retries=0,
            prm_votes=1,
            signal_grace_s=0.5,
            rewards=json.dumps(rewards),
        )
    )
    yield WorkerEnv(broker, url, topics, judge, worker)
    worker.stop()
    judge.stop()


def answer(session_id: str, text: str, group: str | None = None) -> Step:
    s = step(session_id, 0, QUESTION, ChatMessage(role="assistant", content=text))
    return s.model_copy(update={"group_id": group})


async def play(env: WorkerEnv, answers: list[str], metadata: dict[str, Any] | None) -> list[str]:
    """One group of one-turn sessions, started with `metadata`, each answering one of
    `answers`; their session ids."""
    group = new_id("g")
    ids = [new_id("math") for _ in answers]
    await env.events(
        *(
            SessionEvent(session_id=sid, kind="started", group_id=group, metadata=metadata)
            for sid in ids
        )
    )
    await asyncio.sleep(0.5)  # the start is archived before the first step (as the gateway does)
    await env.steps([answer(sid, text, group) for sid, text in zip(ids, answers, strict=True)])
    for sid in ids:
        await env.end(sid, 1)
    return ids


def token_advantages(samples: list[Sample]) -> list[float]:
    """The trainer's per-token advantage of each sample (binary, group-normalised)."""
    rewards = normalise_rewards(
        torch.tensor([s.reward for s in samples]), [s.group_id for s in samples], "group"
    )
    old = torch.zeros(len(samples), 3)
    per_token = advantages(LossConfig(normalise="group"), rewards, old, None)
    assert all(len(set(row.tolist())) == 1 for row in per_token)  # one value per answer
    return [round(float(row[0]), 3) for row in per_token]


async def test_ground_truth_from_start_session_decides_the_advantage(env: WorkerEnv) -> None:
    right, wrong = await play(env, ["It is 42.", "It is 41."], {"answer": 42})
    blind = await play(env, ["It is 42.", "It is 41."], None)
    samples = [(await env.published(sid, 1))[0] for sid in [right, wrong, *blind]]
    # with the expected answer the rule decides; without it the rule abstains and the user's
    # service (0.25 for any answer) is the next source by precedence
    assert [(s.reward, s.reward_source) for s in samples] == [
        (1.0, "answer"),
        (-1.0, "answer"),
        (0.25, "ci"),
        (0.25, "ci"),
    ]
    assert token_advantages(samples[:2]) == [0.707, -0.707]  # the right answer is reinforced
    assert token_advantages(samples[2:]) == [0.0, 0.0]  # nothing tells the two apart
    judgements = await events_on(env.bootstrap, env.topics.judgements, Judgement)
    (judged,) = [j for j in judgements if j.session_id == wrong]
    assert [(r.source, r.score, r.explanation) for r in judged.rewards] == [
        ("answer", -1.0, "41, not 42"),
        ("ci", 0.25, "9 characters"),
    ]  # no next state: the PRM judge had nothing to judge
    (row,) = await env.db(
        "SELECT payload FROM judgements WHERE session_id = $1", wrong
    )  # archived with every source's score
    assert [r["source"] for r in json.loads(row["payload"])["rewards"]] == ["answer", "ci"]


async def test_a_source_that_times_out_goes_to_the_dlq_and_the_turn_is_judged(
    env: WorkerEnv,
) -> None:
    (sid,) = await play(env, ["SLOW: it is 42."], {"answer": 42})
    (sample,) = await env.published(sid, 1)
    assert (sample.reward, sample.reward_source) == (1.0, "answer")

    async def letter() -> list[DeadLetter]:
        letters = await events_on(env.bootstrap, env.topics.dlq, DeadLetter)
        return [d for d in letters if d.key == sid]

    (dead,) = await wait_for(letter, "the dead letter of the slow source", timeout_s=30)
    assert dead.processor == "judge" and dead.source_topic == env.topics.turns
    assert "reward source ci: no score within 1 s" in dead.error
    assert json.loads(dead.value)["session_id"] == sid  # the turn, whole
    judgements = await events_on(env.bootstrap, env.topics.judgements, Judgement)
    (judged,) = [j for j in judgements if j.session_id == sid]
    ci = next(r for r in judged.rewards if r.source == "ci")
    assert ci.score is None and ci.error == "no score within 1 s"


async def test_replay_with_a_new_rule_feeds_the_trainer_and_its_loss(
    env: WorkerEnv, tiny_models, tmp_path: Path
) -> None:
    """Replay the module's traffic with another rule (short answers good) into a new topic;
    the trainer, with a user's loss, trains one step on it and records the loss's metrics."""
    long = new_id("long")
    first = ChatMessage(role="assistant", content="42")
    again = [*QUESTION, first, ChatMessage(role="user", content="Sure?")]
    two = [
        step(long, 0, QUESTION, first),
        step(long, 1, again, ChatMessage(role="assistant", content="Yes, 6 * 7 is 42.")),
    ]  # step() gives turn 0 three tokens, turn 1 four
    await env.steps(two)
    await env.end(long, 2)
    await env.published(long, 2)  # recorded like the rest (ci scored both 0.25)
    target = f"{env.topics.samples}.short-{uuid.uuid4().hex[:6]}"
    config = tmp_path / "replay.yaml"
    short = {"name": "short", "use": f"{PLUGINS}:short_answer"}
    worker = {"rewards": [short], "judge_url": "http://127.0.0.1:9/v1"}  # no judge needed
    config.write_text(json.dumps({"worker": worker, "topics": env.topics.model_dump()}))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "claw_stream",
        "replay",
        "--config",
        str(config),
        "--since",
        "1h",
        "--to-topic",
        target,
        env=child_env(CLAW_KAFKA_BOOTSTRAP=env.bootstrap, CLAW_DATABASE_URL=env.database_url),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, out.decode()
    replayed = await events_on(env.bootstrap, target, Sample)
    assert {s.reward_source for s in replayed} == {"short"}
    by_step = {s.step_id: s.reward for s in replayed}
    assert (by_step[two[0].step_id], by_step[two[1].step_id]) == (1.0, -1.0)

    engine = EngineProcess(tiny_models["alpha"], tmp_path, "--served-model-name", "policy")
    try:
        policy = f"policy-{uuid.uuid4().hex[:6]}"
        trainer_env = {
            "CLAW_KAFKA_BOOTSTRAP": env.bootstrap,
            "CLAW_DATABASE_URL": env.database_url,
            "CLAW_DATA_DIR": str(tmp_path / "data"),
            "CLAW_ADMIN_KEY": ADMIN_KEY,
            "CLAW_POLICY_NAME": policy,
            "CLAW_TRAINER__SAMPLES_TOPIC": target,
            "CLAW_TRAINER__GROUP_ID": f"trainer-{policy}",
            "CLAW_TRAINER__BATCH_SIZE": str(len(replayed)),
            "CLAW_TRAINER__MAX_WAIT_S": "10",
            "CLAW_TRAINER__LOSS": f"{PLUGINS}:plain_pg_loss",
            "CLAW_TRAINER__NORMALISE": "none",  # the raw rewards, for the check below
            "CLAW_TRAINER__ENGINES": json.dumps([engine.base_url]),
            "CLAW_TRAINER__METRICS_PORT": str(free_port()),
            **{f"CLAW_TOPICS__{k.upper()}": v for k, v in env.topics.model_dump().items()},
        }
        trainer = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "claw_stream",
            "trainer",
            "--model",
            str(tiny_models["alpha"]),
            "--max-steps",
            "1",
            env=child_env(**trainer_env),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        log, _ = await asyncio.wait_for(trainer.communicate(), 300)
        assert trainer.returncode == 0, log.decode()[-4000:]
    finally:
        engine.stop()
    conn = await asyncpg.connect(asyncpg_dsn(env.database_url))
    try:
        (row,) = await conn.fetch(
            "SELECT n_samples, extra FROM training_steps WHERE policy = $1", policy
        )
    finally:
        await conn.close()
    extra = json.loads(row["extra"])
    assert row["n_samples"] == len(replayed) and set(extra) == {"mean_advantage", "ppo_loss"}
    # no normalisation: the mean advantage is the token-weighted mean reward of the batch
    tokens = sum(len(s.response_token_ids) for s in replayed)
    expected = sum(s.reward * len(s.response_token_ids) for s in replayed) / tokens
    assert extra["mean_advantage"] == pytest.approx(expected, abs=1e-4)
    assert "mean_advantage" in log.decode()
