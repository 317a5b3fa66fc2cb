"""The user's say: a call, a session or a key kept out of training, and sessions forgotten.
A real gateway in front of a real engine, a real Faust worker, the real broker and Postgres,
`claw-stream forget` and replay; the judge is a server whose answers follow the next state."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import openai
import pytest

from claw_stream.bus.topics import apply_topics, specs_for
from claw_stream.events import Sample, SessionEvent, Step, decode_event
from claw_stream.store.consent import session_tables
from claw_stream.worker.rederive import rederive

from ..support.engine import ADMIN_KEY
from ..support.gateway import GatewayProcess
from ..support.postgres import new_database
from ..support.processes import child_env
from ..support.worker import (
    JudgeStub,
    WorkerEnv,
    WorkerProcess,
    chat,
    events_on,
    new_id,
    read_topic,
    topics_env,
    wait_for,
    worker_topics,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
UNTRAINED_KEY = "team-untrained-agent"  # gateway.untrained_keys: a client key never trained


@pytest.fixture(scope="module")
def live(broker, postgres, tools_engine, tmp_path_factory) -> Iterator[tuple[WorkerEnv, Any]]:
    judge = JudgeStub()
    prefix = new_id("consent")
    topics = worker_topics(prefix)
    asyncio.run(apply_topics(broker, list(specs_for(topics))))
    url = new_database(postgres, "consent")
    worker = WorkerProcess(
        broker,
        url,
        tmp_path_factory.mktemp("consent"),
        topics,
        app_id=prefix,
        sweep_interval_s=0.5,
        judge_url=judge.url,
        reorder_grace_s=1,
        signal_grace_s=0.5,
    )
    env = WorkerEnv(broker, url, topics, judge, worker)
    gateway = GatewayProcess(
        broker,
        url,
        [tools_engine.base_url],
        tmp_path_factory.mktemp("consent-gw"),
        env={**topics_env(topics), "CLAW_GATEWAY__UNTRAINED_KEYS": f'["{UNTRAINED_KEY}"]'},
    )
    yield env, gateway
    gateway.stop()
    worker.stop()
    judge.stop()


def start(gateway: GatewayProcess, **body: Any) -> tuple[str, str]:
    r = httpx.post(gateway.base_url + "/rl/start_session", json=body, headers=ADMIN, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["session_id"], r.json()["api_key"]


async def talk(
    gateway: GatewayProcess,
    key: str,
    texts: list[str],
    headers: list[dict[str, str]] | None = None,
    bodies: list[dict[str, Any]] | None = None,
) -> None:
    client = openai.AsyncOpenAI(base_url=gateway.base_url + "/v1", api_key=key, max_retries=0)
    history: list[dict[str, Any]] = []
    for k, text in enumerate(texts):
        history.append({"role": "user", "content": text})
        reply = await client.chat.completions.create(
            model="policy",
            messages=history,  # type: ignore[arg-type]
            max_tokens=6,
            extra_headers=(headers or [{}] * len(texts))[k],
            extra_body=(bodies or [{}] * len(texts))[k],
        )
        history.append({"role": "assistant", "content": reply.choices[0].message.content or ""})


async def session_events(env: WorkerEnv, session_id: str) -> list[SessionEvent]:
    events = await events_on(env.bootstrap, env.topics.session_events, SessionEvent)
    return sorted((e for e in events if e.session_id == session_id), key=lambda e: e.created_at)


async def samples_of(env: WorkerEnv, session_id: str) -> list[Any]:
    return await env.db(
        "SELECT x.status, t.turn_index FROM samples x JOIN turns t USING (turn_id)"
        " WHERE x.session_id = $1 ORDER BY t.turn_index",
        session_id,
    )


async def judged_rows(env: WorkerEnv, session_id: str, n: int) -> list[Any] | None:
    env.worker.check()
    rows = await env.db(
        "SELECT t.turn_index, j.judge_model, j.payload IS NOT NULL AS judged FROM turns t"
        " JOIN judgements j USING (turn_id) WHERE t.session_id = $1 ORDER BY t.turn_index",
        session_id,
    )
    return rows if len(rows) >= n else None


async def test_a_call_a_session_or_a_switch_keeps_steps_out_of_judging_and_training(live) -> None:
    env, gateway = live
    assert env.judge is not None
    trained, trained_key = start(gateway)
    private, private_key = start(gateway, train=False)
    mixed, mixed_key = start(gateway)
    await talk(gateway, trained_key, ["Plan my week.", "thanks, Monday?", "thanks. Tuesday?"])
    await talk(
        gateway, private_key, ["My zebra diary, day one.", "thanks, zebra day two", "thanks"]
    )
    await talk(
        gateway,
        mixed_key,
        ["Hello there.", "thanks, and my okapi secret?", "thanks, okapi again"],
        headers=[{}, {"X-Claw-Train": "false"}, {}],
        bodies=[{}, {}, {"train": False}],
    )
    by_key = new_id("by-key")  # OpenClaw-RL's convention: a client key and X-Session-Id
    await talk(
        gateway,
        UNTRAINED_KEY,
        ["First.", "thanks, second."],
        headers=[{"X-Session-Id": by_key}] * 2,
    )
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30) as http:
        r = await http.post(
            "/v1/chat/completions",
            json={"model": "policy", "messages": [{"role": "user", "content": "x"}]},
            headers={"X-Claw-Train": "perhaps"},
        )
    assert r.status_code == 422 and "X-Claw-Train" in r.json()["error"]["message"], r.text
    recorded = [
        s
        for s in await events_on(env.bootstrap, env.topics.steps, Step)
        if s.session_id in (trained, private, mixed, by_key)
    ]
    by_session: dict[str, list[bool]] = {}
    for s in sorted(recorded, key=lambda s: s.turn_index):
        by_session.setdefault(s.session_id, []).append(s.train)
    assert by_session == {
        trained: [True, True, True],
        private: [False, False, False],
        mixed: [True, False, False],
        by_key: [False, False],
    }

    # the trained session's first two turns have next states and are sampled; the private
    # session's are stitched (each gives the one before it its next state) but never judged
    await wait_for(lambda: _at_least(samples_of, env, trained, 2), "samples of the trained", 60)
    rows = await wait_for(lambda: judged_rows(env, private, 2), "private turns placed", 60)
    assert not any(r["judged"] for r in rows)
    mixed_rows = await wait_for(lambda: judged_rows(env, mixed, 2), "mixed turns placed", 60)
    assert [r["judged"] for r in mixed_rows][:2] == [True, False]
    await asyncio.sleep(2)  # a release pass or two more
    assert await samples_of(env, private) == []
    assert [r["turn_index"] for r in await samples_of(env, mixed)] == [0]
    # the judge never saw a word of what was kept out (the mixed session's first turn was
    # judged with its next state, the message that said not to train *itself*)
    prompts = " ".join(str(b["messages"]) for b in env.judge.bodies)
    assert "zebra" not in prompts
    assert "okapi again" not in prompts


async def test_switching_a_session_off_needs_its_own_key_and_withdraws_what_is_pending(
    live,
) -> None:
    env, gateway = live
    session, key = start(gateway)
    other, other_key = start(gateway)
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30) as http:

        async def switch(session_id: str, auth: str, body: Any) -> httpx.Response:
            return await http.post(
                f"/rl/sessions/{session_id}/train",
                json=body,
                headers={"Authorization": f"Bearer {auth}"},
            )

        r = await switch(session, other_key, {"enabled": False})
        assert r.status_code == 403, r.text
        assert r.json()["error"]["message"]
        r = await switch("no-such-session", ADMIN_KEY, {"enabled": False})
        assert r.status_code == 404, r.text
        r = await switch(session, key, {"enabled": "maybe"})
        assert r.status_code == 422, r.text
        r = await switch(session, key, {"enabled": False})
        assert r.status_code == 200, r.text
        assert r.json()["train"] is False
        r = await switch(other, ADMIN_KEY, {"enabled": False})
        assert r.status_code == 200, r.text
    await talk(gateway, key, ["One.", "thanks, two.", "thanks, three."])
    recorded = [
        s for s in await events_on(env.bootstrap, env.topics.steps, Step) if s.session_id == session
    ]
    assert [s.train for s in recorded] == [False] * 3
    events = await session_events(env, session)
    assert [(e.kind, e.train) for e in events if e.kind == "train"] == [("train", False)]
    await wait_for(lambda: judged_rows(env, session, 2), "its turns placed", 60)
    await asyncio.sleep(2)
    assert await samples_of(env, session) == []


async def test_a_forgotten_session_leaves_no_row_and_is_never_trained_again(live) -> None:
    env, gateway = live
    kept, kept_key = start(gateway)
    gone, gone_key = start(gateway, request_id=f"req-{uuid.uuid4().hex}")
    since = datetime.now(UTC) - timedelta(seconds=5)
    await talk(gateway, kept_key, ["Keep: plan my week.", "thanks, Monday?", "thanks."])
    await talk(gateway, gone_key, ["Forget: my address.", "thanks, my phone?", "thanks."])
    for session in (kept, gone):
        await wait_for(lambda s=session: _at_least(samples_of, env, s, 2), "samples", 60)

    async def rows_of(session_id: str) -> dict[str, int]:
        counts = {}
        for table in session_tables():
            (row,) = await env.db(
                f"SELECT count(*) AS n FROM {table.name} WHERE session_id = $1", session_id
            )
            counts[table.name] = row["n"]
        (row,) = await env.db(
            "SELECT count(*) AS n FROM start_requests WHERE answer->'session_ids' ? $1",
            session_id,
        )
        counts["start_requests"] = row["n"]
        return counts

    before = await rows_of(gone)
    assert before["steps"] == 3 and before["samples"] >= 2 and before["start_requests"] == 1

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "claw_stream", "forget", *args, "--base-url", gateway.base_url],
            capture_output=True,
            text=True,
            env=child_env(CLAW_ADMIN_KEY=ADMIN_KEY, COLUMNS="200"),
            timeout=120,
        )

    done = cli("--session", gone)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "forgot 1 session(s)" in done.stdout
    assert "claw.steps" in done.stdout  # what Kafka keeps, and for how long
    after = await rows_of(gone)
    assert set(after.values()) == {0}, after
    assert (await rows_of(kept))["steps"] == 3
    events = await session_events(env, gone)
    assert events[-1].kind == "forgotten"

    # its key is gone with it; forgetting again, an unknown session or two at once: clear errors
    client = openai.AsyncOpenAI(base_url=gateway.base_url + "/v1", api_key=gone_key, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}]
        )
    again = cli("--session", gone)
    assert again.returncode != 0 and "forgotten already" in again.stderr, again.stderr
    unknown = cli("--session", "s-never-was")
    assert unknown.returncode != 0 and "unknown session" in unknown.stderr, unknown.stderr
    both = cli("--session", gone, "--before", "1d")
    assert both.returncode != 0 and "exactly one" in both.stderr, both.stderr
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(gateway.base_url + "/rl/forget", json={"session_id": kept})
    assert r.status_code in (401, 403), r.text
    assert (await rows_of(kept))["steps"] == 3

    # a step of the forgotten session that reaches the worker late is dropped, not archived
    late = chat(gone, ["late"])[0].model_copy(update={"turn_index": 3})
    await env.steps([late])
    await asyncio.sleep(3)
    env.worker.check()
    assert set((await rows_of(gone)).values()) == {0}

    # a replay of the topics trains the kept session again, never the forgotten one
    to_topic = f"claw.samples.{new_id('replay')}"
    report = await rederive(
        config=_replay_config(env),
        topics=env.topics,
        kafka_bootstrap=env.bootstrap,
        database_url=env.database_url,
        source="kafka",
        since=since,
        until=None,
        to_topic=to_topic,
    )
    replayed = [decode_event(Sample, v) for v in await read_topic(env.bootstrap, to_topic)]
    sessions = {s.session_id for s in replayed}
    assert kept in sessions and gone not in sessions
    assert report.withheld_sessions >= 1


async def test_a_forget_reaches_the_stored_responses_of_every_gateway_process(
    live, tools_engine, tmp_path
) -> None:
    """A Responses conversation stored by one gateway process cannot be continued there once
    another process forgot its session (stored responses live in each process's memory)."""
    env, gateway = live
    other = GatewayProcess(
        env.bootstrap,
        env.database_url,
        [tools_engine.base_url],
        tmp_path,
        env=topics_env(env.topics),
    )
    try:
        session, key = start(gateway)
        async with httpx.AsyncClient(timeout=60) as http:
            first = await http.post(
                other.base_url + "/v1/responses",
                json={
                    "model": "policy",
                    "input": "My address is 1 Elm St.",
                    "max_output_tokens": 4,
                },
                headers={"Authorization": f"Bearer {key}"},
            )
            assert first.status_code == 200, first.text
            chain = {
                "model": "policy",
                "input": "And my phone?",
                "previous_response_id": first.json()["id"],
                "max_output_tokens": 4,
            }
            again = await http.post(other.base_url + "/v1/responses", json=chain, headers=ADMIN)
            assert again.status_code == 200, again.text  # the chain continues before the forget
            r = await http.post(
                gateway.base_url + "/rl/forget", json={"session_id": session}, headers=ADMIN
            )
            assert r.status_code == 200, r.text
            after = await http.post(other.base_url + "/v1/responses", json=chain, headers=ADMIN)
        assert after.status_code == 404, after.text
        assert after.json()["error"]["param"] == "previous_response_id"
    finally:
        other.stop()


def _replay_config(env: WorkerEnv) -> Any:
    from claw_stream.worker.config import WorkerSettings

    assert env.judge is not None
    return WorkerSettings(judge_url=env.judge.url, reorder_grace_s=0)


async def _at_least(probe: Any, env: WorkerEnv, session_id: str, n: int) -> list[Any] | None:
    env.worker.check()
    rows = await probe(env, session_id)
    return rows if len(rows) >= n else None


def test_session_event_of_a_switch_needs_its_value() -> None:
    with pytest.raises(ValueError, match="train"):
        SessionEvent(session_id="s", kind="train")
