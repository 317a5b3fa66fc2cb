"""A personal agent's conversation goes on for days: it is trained while it goes on, across
idle pauses, and its side calls (compaction, titles) are told apart without headers. A real
gateway (openai client, session keys) in front of a real engine, a real Faust worker, the real
broker and Postgres; the judge is a server whose answers follow the next state."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from claw_stream.bus.topics import apply_topics, specs_for

from ..support.engine import ADMIN_KEY
from ..support.gateway import GatewayProcess
from ..support.paths import AGENTS
from ..support.postgres import new_database
from ..support.worker import (
    JudgeStub,
    WorkerEnv,
    WorkerProcess,
    new_id,
    topics_env,
    wait_for,
    worker_topics,
)

IDLE_S = 3.0
JUDGE_CONTEXT = 640  # so that even these short histories must be cut
FIXTURES = AGENTS / "openclaw"


def _env(broker: str, postgres: Any, tmp: Path, label: str, **worker: Any) -> WorkerEnv:
    """A worker on topics of its own, created as their specs say (a gateway refuses a topic
    whose partition count differs from its spec), and a database of its own."""
    judge = JudgeStub()
    prefix = new_id(label)
    topics = worker_topics(prefix)
    asyncio.run(apply_topics(broker, list(specs_for(topics))))
    url = new_database(postgres, label)
    proc = WorkerProcess(
        broker,
        url,
        tmp,
        topics,
        app_id=prefix,
        sweep_interval_s=0.5,
        judge_url=judge.url,
        idle_timeout_s=IDLE_S,
        reorder_grace_s=2,
        signal_grace_s=0.5,
        **worker,
    )
    return WorkerEnv(broker, url, topics, judge, proc)


def _start_session(gateway: GatewayProcess) -> tuple[str, str]:
    r = httpx.post(
        gateway.base_url + "/rl/start_session",
        json={},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.json()["session_id"], r.json()["api_key"]


@pytest.fixture(scope="module")
def live(broker, postgres, tools_engine, tmp_path_factory) -> Iterator[tuple[WorkerEnv, Any]]:
    """A worker (per_turn by default) and a gateway on topics and a database of their own."""
    env = _env(broker, postgres, tmp_path_factory.mktemp("live"), "live", tail_timeout_s=600)
    gateway = GatewayProcess(
        broker,
        env.database_url,
        [tools_engine.base_url],
        tmp_path_factory.mktemp("live-gw"),
        env=topics_env(env.topics),
    )
    yield env, gateway
    gateway.stop()
    env.worker.stop()
    assert env.judge is not None
    env.judge.stop()


async def test_a_conversation_across_idle_pauses_is_trained_while_it_goes_on(live) -> None:
    env, gateway = live
    session_id, key = _start_session(gateway)
    client = openai.AsyncOpenAI(base_url=gateway.base_url + "/v1", api_key=key, max_retries=0)
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are my assistant."}]
    parts = [
        ["Plan my week.", "thanks, and Monday?", "thanks. Tuesday?"],
        ["thanks! I'm back: what about Wednesday?", "thanks, Thursday?", "thanks. Friday?"],
        ["thanks, good morning: the weekend?", "thanks. Sunday?", "thanks, that is all."],
    ]

    async def say(text: str) -> None:
        history.append({"role": "user", "content": text})
        reply = await client.chat.completions.create(
            model="policy", messages=history, max_tokens=8
        )  # raises unless the call succeeded
        history.append({"role": "assistant", "content": reply.choices[0].message.content or ""})

    async def published() -> list[Any]:
        return await env.db(
            "SELECT x.reward, x.reward_source, t.segment FROM samples x"
            " JOIN turns t USING (turn_id) WHERE x.session_id = $1 AND x.status = 'published'",
            session_id,
        )

    for k, part in enumerate(parts):
        for text in part:
            await say(text)
        # samples come while the conversation goes on: this part's turns that have a next
        # state are trained before the user comes back (or ends anything)
        n = 3 * k + 2
        await wait_for(lambda n=n: _at_least(published, n), f"{n} samples during part {k + 1}", 60)
        if k < 2:  # a pause longer than the idle timeout: the worker closes the segment
            await wait_for(
                lambda k=k: env.db(
                    "SELECT 1 FROM pipeline_segments WHERE session_id = $1 AND segment = $2"
                    " AND closed_at IS NOT NULL",
                    session_id,
                    k,
                ),
                f"segment {k} closed by idle",
                30,
            )
    async with httpx.AsyncClient() as http:
        r = await http.post(
            gateway.base_url + "/rl/end_session",
            json={},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
    assert r.status_code == 200, r.text

    async def all_judged() -> list[Any] | None:
        env.worker.check()
        rows = await env.db(
            "SELECT t.turn_index, t.segment, t.closed_reason, t.has_next_state,"
            " j.prm_score, x.status FROM turns t"
            " LEFT JOIN judgements j ON j.turn_id = t.turn_id"
            " LEFT JOIN samples x ON x.turn_id = t.turn_id"
            " WHERE t.session_id = $1 ORDER BY t.turn_index",
            session_id,
        )
        done = len(rows) == 9 and all(r["status"] for r in rows)
        return rows if done else None

    rows = await wait_for(all_judged, "every turn of the three parts judged and sampled", 60)
    assert [r["segment"] for r in rows] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    # the turn before each pause is judged by what the user said when they came back
    assert all(r["has_next_state"] for r in rows[:8])
    assert [r["closed_reason"] for r in rows] == ["next_step"] * 8 + ["session_ended"]
    assert [r["prm_score"] for r in rows[:8]] == [1] * 8
    assert [r["status"] for r in rows] == ["published"] * 8 + ["no_signal"]
    samples = await published()
    assert sorted(r["segment"] for r in samples) == [0, 0, 0, 1, 1, 1, 2, 2]
    # the user's words when they came back decide where they judge the answer (`reaction`,
    # first by default), the PRM where they do not; both read them as approval
    assert {r["reward_source"] for r in samples} <= {"reaction", "prm"}
    assert all(r["reward"] > 0 for r in samples)
    episodes = await env.db(
        "SELECT segment, n_steps, n_main_steps, n_turns, n_samples, n_not_considered"
        " FROM episodes WHERE session_id = $1 ORDER BY segment",
        session_id,
    )
    assert [tuple(e.values()) for e in episodes] == [
        (0, 3, 3, 3, 3, 0),
        (1, 3, 3, 3, 3, 0),
        (2, 3, 3, 3, 2, 0),
    ]


async def _at_least(probe: Any, n: int) -> list[Any] | None:
    rows = await probe()
    return rows if len(rows) >= n else None


# --- OpenClaw's real requests: side calls and judge prompt bounds -------------------------------


def _bodies(name: str) -> list[dict[str, Any]]:
    return [json.loads(line)["body"] for line in (FIXTURES / name).read_text().splitlines()]


def side_calls(main: dict[str, Any]) -> list[dict[str, Any]]:
    """Side calls shaped like OpenClaw's own: a compaction that summarises the history and a
    title, each with a system prompt of its own and no tools."""
    history = "\n".join(
        f"{m['role']}: {m['content'] if isinstance(m['content'], str) else json.dumps(m['content'])}"
        for m in main["messages"][1:]
        if m.get("content")
    )
    compaction = {
        "model": "policy",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": "You summarise conversations for later context."},
            {"role": "user", "content": f"Summarise this conversation:\n\n{history}"},
        ],
    }
    title = {
        "model": "policy",
        "stream": False,
        "messages": [
            {"role": "system", "content": "Write a title of at most six words."},
            {"role": "user", "content": main["messages"][1]["content"]},
        ],
    }
    return [compaction, title]


def test_openclaw_side_calls_are_told_apart_and_judge_prompts_fit(
    broker, postgres, stub_upstream, smollm2, tmp_path
) -> None:
    env = _env(broker, postgres, tmp_path / "w", "openclaw", judge_context_tokens=JUDGE_CONTEXT)
    gateway = GatewayProcess(
        broker, env.database_url, [stub_upstream], tmp_path, env=topics_env(env.topics)
    )
    try:
        bodies = _bodies("session.jsonl")
        local, one_shot = bodies[:3], bodies[3:]
        sessions = {}
        for name, calls in (("local", local), ("exec", one_shot)):
            session_id, key = _start_session(gateway)
            sessions[name] = session_id
            # OpenClaw's calls of the session, with its side calls after the first turn
            order = [calls[0], *side_calls(calls[0]), *calls[1:]]
            for body in order:  # no session or turn header: the key ties them to the session
                r = httpx.post(
                    gateway.base_url + "/v1/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {key}"},
                    timeout=60,
                )
                assert r.status_code == 200, r.text[:500]
            httpx.post(
                gateway.base_url + "/rl/end_session",
                json={},
                headers={"Authorization": f"Bearer {key}"},
                timeout=30,
            ).raise_for_status()

        async def placed(session_id: str, n: int) -> list[Any] | None:
            env.worker.check()
            rows = await env.db(
                "SELECT p.turn_type, p.classified_by FROM pipeline_steps p"
                " WHERE p.session_id = $1 ORDER BY p.turn_index",
                session_id,
            )
            return rows if len(rows) == n else None

        local_rows = asyncio.run(wait_for(lambda: placed(sessions["local"], 5), "local steps"))
        assert [r["turn_type"] for r in local_rows] == ["main", "side", "side", "main", "main"]
        assert [r["classified_by"] for r in local_rows][1:3] == ["other_prompt"] * 2
        exec_rows = asyncio.run(wait_for(lambda: placed(sessions["exec"], 4), "exec steps"))
        assert [r["turn_type"] for r in exec_rows] == ["main", "side", "side", "main"]

        async def judged() -> list[Any] | None:
            rows = await env.db("SELECT history_cut FROM judgements")
            return rows if len(rows) == 5 else None  # 3 main turns + 2 main turns

        asyncio.run(wait_for(judged, "every main turn judged"))
        assert env.judge is not None and env.judge.bodies
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(smollm2)
        for body in env.judge.bodies:
            n = len(tokenizer.apply_chat_template(body["messages"], tokenize=True))
            # the prompt and the room for the judge's answer fit the judge's context
            assert n + body["max_tokens"] <= JUDGE_CONTEXT, (n, body["max_tokens"])
            assert "[assistant answer]" in body["messages"][-1]["content"]
            assert "[next state:" in body["messages"][-1]["content"]
        # OpenClaw's prompts do not fit whole: the oldest history was cut, and the judgement
        # says so
        cuts = asyncio.run(
            env.db("SELECT history_cut, jsonb_array_length(prm_votes) AS n_votes FROM judgements")
        )
        assert max(r["history_cut"] for r in cuts) >= 1
        # a turn's three PRM votes in one request (n): one request per turn with a next state
        # (each session's last turn has none), and those judgements hold all three votes
        assert [b.get("n") for b in env.judge.bodies] == [3, 3, 3]
        assert sorted(r["n_votes"] for r in cuts) == [0, 0, 3, 3, 3]
    finally:
        gateway.stop()
        env.worker.stop()
        assert env.judge is not None
        env.judge.stop()
