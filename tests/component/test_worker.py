"""The stream processors end to end: a real Faust worker on the real broker and Postgres, with
a judge server whose answers the test controls. Scripted conversations in, samples out."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from claw_stream.events import (
    ChatMessage,
    DeadLetter,
    FunctionCall,
    Judgement,
    Sample,
    SessionEvent,
    Step,
    ToolCall,
    WeightEvent,
)

from ..support.processes import child_env
from ..support.worker import (
    JudgeStub,
    WorkerEnv,
    chat,
    events_on,
    new_id,
    private_worker,
    send,
    step,
    wait_for,
)

IDLE_S = 4.0


@pytest.fixture(scope="module")
def env(broker, postgres, tmp_path_factory) -> Any:
    judge = JudgeStub(slow_s=20)
    worker, topics, url = asyncio.run(
        private_worker(
            broker,
            postgres,
            tmp_path_factory.mktemp("worker"),
            "worker",
            judge_url=judge.url,
            idle_timeout_s=IDLE_S,
            tail_timeout_s=2,  # an idle close's last turn waits this long for a resume
            reorder_grace_s=3,
            judge_timeout_s=2,
            judge_retries=0,
            judge_give_up_after_s=6,  # after its first timeout, a turn is judged again in 5 s
            orphan_after_s=3,
            max_staleness=1,
        )
    )
    yield WorkerEnv(broker, url, topics, judge, worker)
    worker.stop()
    judge.stop()


async def test_user_reply_is_judged_and_becomes_the_reward(env: WorkerEnv) -> None:
    sid = new_id("reply")
    await env.steps(chat(sid, ["Name a colour.", "Perfect, thanks!"]))
    await env.end(sid, 2)
    rows = await env.assembled(sid)
    turns = await env.turns(sid)
    assert [t.closed_reason for t in turns] == ["next_step", "session_ended"]
    assert turns[0].next_state == [ChatMessage(role="user", content="Perfect, thanks!")]
    assert turns[1].is_last and turns[1].next_state is None
    # turn 0: the user's thanks -> +1 (the reaction source, first by default; the three PRM
    # votes saw it too); turn 1 has no next state: no signal
    assert [r["status"] for r in rows] == ["published", "no_signal"]
    (sample,) = await env.published(sid, 1)
    assert (sample.reward, sample.reward_source, sample.method) == (1.0, "reaction", "binary")
    assert sample.response_token_ids == turns[0].step.response_token_ids
    assert sample.response_logprobs == turns[0].step.response_logprobs
    judgement = (
        await env.db(
            "SELECT prm_votes, prm_score FROM judgements WHERE turn_id = $1", sample.turn_id
        )
    )[0]
    assert json.loads(judgement["prm_votes"]) == [1, 1, 1] and judgement["prm_score"] == 1


async def test_tool_result_is_the_next_state(env: WorkerEnv) -> None:
    sid = new_id("tool")
    call = ToolCall(id="call_9", function=FunctionCall(name="read", arguments='{"path": "x"}'))
    ask = [ChatMessage(role="user", content="Read x.")]
    answer = ChatMessage(role="assistant", content=None, tool_calls=[call])
    result = ChatMessage(role="tool", tool_call_id="call_9", content="error: no such file x")
    first = step(sid, 0, ask, answer)
    second = step(sid, 1, [*ask, answer, result], ChatMessage(role="assistant", content="Sorry."))
    await env.steps([first, second])
    await env.end(sid, 2)
    await env.assembled(sid)
    turns = await env.turns(sid)
    assert turns[0].next_state == [result]
    (sample,) = await env.published(sid, 1)
    assert (sample.step_id, sample.reward) == (first.step_id, -1.0)


async def test_side_turns_are_archived_not_trained(env: WorkerEnv) -> None:
    sid = new_id("side")
    main = chat(sid, ["Plan a trip.", "Great, thanks."])
    side = step(
        sid,
        1,
        [ChatMessage(role="user", content="Summarise the chat.")],
        ChatMessage(role="assistant", content="A trip plan."),
        turn_type="side",
    )
    main[1] = main[1].model_copy(update={"turn_index": 2})
    await env.steps([main[0], side, main[1]])
    await env.end(sid, 3)
    await env.assembled(sid)
    turns = await env.turns(sid)
    assert [t.step.step_id for t in turns] == [main[0].step_id, main[1].step_id]
    archived = await env.db(
        "SELECT turn_type FROM steps WHERE session_id = $1 ORDER BY turn_index", sid
    )
    assert [r["turn_type"] for r in archived] == ["main", "side", "main"]
    (sample,) = await env.published(sid, 1)
    assert sample.step_id == main[0].step_id


async def test_refresh_and_idle_timeout_close_sessions(env: WorkerEnv) -> None:
    refreshed, idle = new_id("refresh"), new_id("idle")
    await env.steps(chat(refreshed, ["Hi."]) + chat(idle, ["Hello?"]))
    await env.events(
        SessionEvent(session_id=refreshed, kind="refreshed", reason="refreshed", n_steps=1)
    )
    await env.assembled(refreshed)
    assert [t.closed_reason for t in await env.turns(refreshed)] == ["refreshed"]
    # nobody ended it: the worker closes it after IDLE_S, and after tail_timeout_s more without
    # the conversation resuming, judges its last turn without a next state
    await env.assembled(idle)
    (turn,) = await env.turns(idle)
    assert turn.closed_reason == "idle_timeout" and turn.is_last


async def test_episode_reward_is_discounted_back_over_the_turns(env: WorkerEnv) -> None:
    sid = new_id("episode")
    await env.steps(chat(sid, ["Step one.", "Go on.", "And then?"]))
    await env.events(SessionEvent(session_id=sid, kind="reward", reward=1.0))
    await env.end(sid, 3)
    samples = await env.published(sid, 3)
    assert [s.reward_source for s in samples] == ["episode"] * 3
    assert [round(s.reward, 6) for s in samples] == [0.81, 0.9, 1.0]  # gamma 0.9


async def test_thumbs_feedback_overrides_the_judge(env: WorkerEnv) -> None:
    sid = new_id("thumbs")
    steps = chat(sid, ["Write a haiku.", "Thanks!"])
    await env.steps(steps)
    await env.events(
        SessionEvent(session_id=sid, kind="feedback", score=-1, step_id=steps[0].step_id),
        SessionEvent(session_id=sid, kind="feedback", score=1, text="nice"),  # the last answer
    )
    await env.end(sid, 2)
    samples = await env.published(sid, 2)
    assert [(s.reward, s.reward_source) for s in samples] == [(-1.0, "feedback"), (1.0, "feedback")]


async def test_duplicates_and_out_of_order_arrival(env: WorkerEnv) -> None:
    sid = new_id("order")
    steps = chat(sid, ["Count to three.", "wrong, start at one", "Thanks."])
    await env.end(sid, 3)  # the end overtakes the steps (another topic, another partition)
    await asyncio.sleep(1.0)
    await env.steps([steps[2], steps[0], steps[0], steps[1], steps[2]])
    rows = await env.assembled(sid)
    assert len(rows) == 3  # one sample row per turn, however often a step came
    turns = await env.turns(sid)
    assert [t.step.step_id for t in turns] == [s.step_id for s in steps]
    assert turns[0].next_state[0].content == "wrong, start at one"
    samples = await env.published(sid, 2)
    assert [s.reward for s in samples] == [-1.0, 1.0]
    assert len({s.sample_id for s in samples}) == len(samples)


async def test_malformed_records_go_to_the_dead_letter_queue(env: WorkerEnv) -> None:
    bad = new_id("bad")
    await send(env.bootstrap, env.topics.steps, [b"{not json"], key=bad)
    await send(
        env.bootstrap, env.topics.session_events, [b'{"session_id": "x", "kind": "nope"}'], key=bad
    )

    async def letters() -> list[DeadLetter] | None:
        found = [
            d for d in await events_on(env.bootstrap, env.topics.dlq, DeadLetter) if d.key == bad
        ]
        return found if len(found) >= 2 else None

    found = await wait_for(letters, "two dead letters")
    assert {d.source_topic for d in found} == {
        env.topics.steps,
        env.topics.session_events,
    }
    assert {d.error_type for d in found} == {"EventError"} and {d.processor for d in found} == {
        "stitch"
    }
    assert "{not json" in {d.value for d in found}
    # and the worker goes on
    sid = new_id("after-bad")
    await env.steps(chat(sid, ["Still there?", "Yes, thanks."]))
    await env.end(sid, 2)
    assert len(await env.published(sid, 1)) == 1


async def test_a_slow_judge_is_asked_again_and_the_turn_is_sampled(env: WorkerEnv) -> None:
    sid = new_id("sluggish")
    await env.steps(chat(sid, ["Think hard.", "A sluggish judge, thanks"]))
    await env.end(sid, 2)
    (sample,) = await env.published(sid, 1)  # the turn with a next state
    assert sample.reward == 1.0
    votes = await env.db("SELECT prm_votes FROM judgements WHERE turn_id = $1", sample.turn_id)
    assert json.loads(votes[0]["prm_votes"]) == [1, 1, 1]  # the judge's answer, not a gap
    assert await env.db("SELECT * FROM judge_retries WHERE session_id = $1", sid) == []
    letters = [
        d for d in await events_on(env.bootstrap, env.topics.dlq, DeadLetter) if d.key == sid
    ]
    assert letters == []


def rendered_otherwise(first: Step, *later: Step) -> list[Step]:
    """The later steps as an engine makes them that renders the first answer otherwise than
    it was sampled (one token of it split another way), in every prompt that holds it."""
    at = len(first.prompt_token_ids)
    out = []
    for s in later:
        ids = list(s.prompt_token_ids)
        ids[at] += 1
        out.append(s.model_copy(update={"prompt_token_ids": ids}))
    return out


async def test_a_turn_whose_prompt_ids_drifted_is_recorded_and_counted(env: WorkerEnv) -> None:
    """worker.token_drift: keep (the default here): counted, recorded, trained on its own ids;
    `drop` dead-letters it (test_a_turn_whose_prompt_ids_drifted_is_dropped_when_asked)."""
    sid = new_id("drift-kept")
    first, second, third = chat(sid, ["Name a colour.", "Thanks!", "Great, thanks!"])
    second, third = rendered_otherwise(first, second, third)
    await env.steps([first, second, third])
    await env.end(sid, 3)
    rows = await env.assembled(sid)
    turns = await env.turns(sid)
    assert [t.token_drift is not None for t in turns] == [False, True, False]
    published = [r["step_id"] for r in rows if r["status"] == "published"]
    assert published == [first.step_id, second.step_id]  # both thanked, both trained
    (row,) = await env.db("SELECT token_drift FROM turns WHERE step_id = $1", second.step_id)
    assert row["token_drift"].startswith("token_drift: prompt ids part")


async def test_a_turn_whose_prompt_ids_drifted_is_dropped_when_asked(
    broker: str, postgres: Any, tmp_path: Path
) -> None:
    judge = JudgeStub()
    worker, topics, url = await private_worker(
        broker, postgres, tmp_path, "drift", judge_url=judge.url, token_drift="drop"
    )
    env = WorkerEnv(broker, url, topics, judge, worker)
    try:
        await _dropped_turn(env)
    finally:
        worker.stop()
        judge.stop()


async def _dropped_turn(env: WorkerEnv) -> None:
    sid = new_id("drift")
    first, second, third = chat(sid, ["Name a colour.", "Thanks!", "Great, thanks!"])
    second, third = rendered_otherwise(first, second, third)
    assert env.judge is not None
    await env.steps([first, second, third])
    await env.end(sid, 3)
    rows = await env.assembled(sid)
    turns = await env.turns(sid)
    assert [t.token_drift is not None for t in turns] == [False, True, False]
    # turn 0 trained on "Thanks!"; turn 1 never judged nor trained; turn 2 has no next state
    assert [r["step_id"] for r in rows if r["status"] == "published"] == [first.step_id]
    letters = [
        d for d in await events_on(env.bootstrap, env.topics.dlq, DeadLetter) if d.key == sid
    ]
    assert [d.error.split(":")[0] for d in letters] == ["token_drift"]
    assert "great, thanks!" not in env.judge.asked  # never put to the judge
    (row,) = await env.db("SELECT token_drift FROM turns WHERE step_id = $1", second.step_id)
    assert row["token_drift"].startswith("token_drift: prompt ids part")


async def test_a_judge_that_never_answers_is_dead_lettered_and_the_session_goes_on(
    env: WorkerEnv,
) -> None:
    sid = new_id("slow")
    await env.steps(chat(sid, ["Think hard.", "SLOW reply"]))
    await env.events(SessionEvent(session_id=sid, kind="reward", reward=0.5, step_id=None))
    await env.end(sid, 2)
    rows = await env.assembled(sid)
    judgement = await env.db(
        "SELECT prm_score, prm_votes FROM judgements WHERE session_id = $1 AND step_id = $2",
        sid,
        rows[0]["step_id"],
    )
    assert judgement[0]["prm_score"] is None and json.loads(judgement[0]["prm_votes"]) == []
    letters = [
        d for d in await events_on(env.bootstrap, env.topics.dlq, DeadLetter) if d.key == sid
    ]
    assert letters and letters[0].processor == "judge" and "Timeout" in letters[0].error
    assert letters[0].error.startswith("judge_unavailable")  # asked again, then given up
    (kept,) = await env.db(
        "SELECT attempts, gave_up_at FROM judge_retries WHERE session_id = $1", sid
    )
    assert kept["attempts"] >= 2 and kept["gave_up_at"] is not None
    samples = await env.published(sid, 2)  # the episode reward still teaches
    assert [s.reward_source for s in samples] == ["episode", "episode"]


async def test_samples_are_held_while_an_update_is_open_and_stale_ones_dropped(
    env: WorkerEnv,
) -> None:
    weights = env.topics.weights
    await send(env.bootstrap, weights, [WeightEvent(policy="policy", version=1, status="updating")])
    sid = new_id("held")
    await env.steps(chat(sid, ["Hello.", "thanks"]))
    await env.end(sid, 2)
    rows = await env.assembled(sid)
    assert rows[0]["status"] == "held"
    await asyncio.sleep(2)
    assert await env.samples(sid) == []  # nothing released while updating
    await send(env.bootstrap, weights, [WeightEvent(policy="policy", version=1, status="ready")])
    (sample,) = await env.published(sid, 1)
    assert sample.released_at_version == 1 and sample.weight_version == 0

    # version 3 is ready; max_staleness 1: a sample from version 1 is dropped, one from 2 kept
    await send(
        env.bootstrap,
        weights,
        [
            WeightEvent(policy="policy", version=3, status="updating"),
            WeightEvent(policy="policy", version=3, status="ready"),
        ],
    )
    await wait_for(
        lambda: env.db("SELECT 1 FROM weight_versions WHERE version = 3 AND status = 'ready'"),
        "version 3 archived",
    )
    stale, fresh = new_id("stale"), new_id("fresh")
    await env.steps(chat(stale, ["Hi.", "thanks"], weight_version=1))
    await env.steps(chat(fresh, ["Hi.", "thanks"], weight_version=2))
    await env.end(stale, 2)
    await env.end(fresh, 2)
    assert (await env.assembled(stale))[0]["status"] == "dropped"
    assert (await env.assembled(fresh))[0]["status"] == "published"
    (kept,) = await env.published(fresh, 1)
    assert kept.released_at_version == 3
    assert await env.samples(stale) == []
    judgements = await events_on(env.bootstrap, env.topics.judgements, Judgement)
    assert any(j.session_id == stale for j in judgements)  # judged, then dropped at release


@pytest.mark.parametrize("source", ["postgres", "kafka"])
async def test_replay_reruns_the_pipeline_with_another_config(
    env: WorkerEnv, source, tmp_path
) -> None:
    """Replay the module's traffic with PRM as the only reward: thumbs no longer count."""
    assert env.judge is not None
    target = f"{env.topics.samples}.prm-only.{source}"
    config = tmp_path / "replay.yaml"
    worker = {"judge_url": env.judge.url, "judge_timeout_s": 2, "judge_retries": 0}
    worker["precedence"] = ["prm"]
    # JSON is YAML
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
        "--source",
        source,
        "--to-topic",
        target,
        env=child_env(CLAW_KAFKA_BOOTSTRAP=env.bootstrap, CLAW_DATABASE_URL=env.database_url),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, out.decode()
    replayed = await events_on(env.bootstrap, target, Sample)
    thumbs = sorted(
        (s for s in replayed if s.session_id.startswith("thumbs-")),
        key=lambda s: len(s.prompt_token_ids),  # in turn order
    )
    assert [(s.reward, s.reward_source) for s in thumbs] == [(1.0, "prm")]  # judged "Thanks!"
    order = [s for s in replayed if s.session_id.startswith("order-")]
    assert sorted(s.reward for s in order) == [-1.0, 1.0]
    assert len({s.sample_id for s in replayed}) == len(replayed)
    live = {s.sample_id for s in await events_on(env.bootstrap, env.topics.samples, Sample)}
    assert not live & {s.sample_id for s in replayed}  # another topic, other ids
    assert "samples" in out.decode()


async def test_analytics_views_and_stats(env: WorkerEnv) -> None:
    (reply,) = await env.db(
        "SELECT * FROM episodes WHERE session_id LIKE 'reply-%' ORDER BY started_at LIMIT 1"
    )
    assert (reply["n_steps"], reply["n_turns"], reply["n_samples"]) == (2, 2, 1)
    assert float(reply["mean_reward"]) == 1.0 and float(reply["judge_agreement"]) == 1.0
    versions = {r["weight_version"]: r for r in await env.db("SELECT * FROM reward_per_version")}
    assert {0, 1, 2} <= set(versions) and versions[1]["n_dropped_stale"] >= 1
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "claw_stream",
        "stats",
        env=child_env(CLAW_DATABASE_URL=env.database_url, COLUMNS="200"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out = (await asyncio.wait_for(proc.communicate(), 60))[0].decode()
    assert proc.returncode == 0, out
    for title in ("reward per version", "training curve", "episodes"):
        assert title in out
    assert reply["session_id"][:12] in out or "reply-" in out


async def test_after_a_rollback_staleness_counts_from_the_rolled_back_version(
    env: WorkerEnv,
) -> None:
    """v5 served, then rolled back to v3 (max_staleness 1): the serving version is the newest
    ready, not the highest one, so a sample of v5 is two versions off and dropped, one of v4
    kept."""
    weights = env.topics.weights
    await send(
        env.bootstrap,
        weights,
        [
            WeightEvent(policy="policy", version=5, status="ready"),
            WeightEvent(policy="policy", version=3, status="ready", rolled_back_from=5),
        ],
    )
    await wait_for(
        lambda: env.db(
            "SELECT 1 FROM weight_versions WHERE version = 3 AND ready_at > "
            "(SELECT ready_at FROM weight_versions WHERE version = 5)"
        ),
        "the rollback archived",
    )
    ahead, near = new_id("ahead"), new_id("near")
    await env.steps(chat(ahead, ["Hi.", "thanks"], weight_version=5))
    await env.steps(chat(near, ["Hi.", "thanks"], weight_version=4))
    await env.end(ahead, 2)
    await env.end(near, 2)
    assert (await env.assembled(ahead))[0]["status"] == "dropped"
    assert (await env.assembled(near))[0]["status"] == "published"
    (kept,) = await env.published(near, 1)
    assert kept.weight_version == 4 and kept.released_at_version == 4
