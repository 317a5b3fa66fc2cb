"""A secret a user types never leaves the gateway in the text of a Step: not on claw.steps, not
in Postgres after a real Faust worker archived it, not in the judge's prompt. A real gateway in
front of the stub upstream (vLLM's protocol), the real broker, Postgres and worker; the judge is
the test's server, which keeps every prompt it is sent."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from claw_stream.bus.topics import apply_topics, specs_for
from claw_stream.events import Step, decode_event

from ..support.gateway import GatewayProcess
from ..support.postgres import new_database
from ..support.worker import (
    JudgeStub,
    WorkerEnv,
    WorkerProcess,
    new_id,
    read_topic,
    topics_env,
    wait_for,
    worker_topics,
)

SECRET = "sk-proj-Q7wE9rT1yU3iO5pA8sD2fG4hJ6kL0zX"
EMAIL = "jane.doe@example.org"


@pytest.fixture(scope="module")
def stack(
    broker, postgres, stub_upstream, tmp_path_factory
) -> Iterator[tuple[WorkerEnv, GatewayProcess]]:
    tmp_path = tmp_path_factory.mktemp("redact")
    judge = JudgeStub()
    prefix = new_id("redact")
    topics = worker_topics(prefix)
    asyncio.run(apply_topics(broker, list(specs_for(topics))))
    url = new_database(postgres, "redact")
    worker = WorkerProcess(
        broker,
        url,
        tmp_path / "worker",
        topics,
        app_id=prefix,
        sweep_interval_s=0.5,
        judge_url=judge.url,
        prm_votes=1,
        reorder_grace_s=0.5,
        idle_timeout_s=600,  # the last turn stays open: only the first one is judged
    )
    gateway = GatewayProcess(broker, url, [stub_upstream], tmp_path, env=topics_env(topics))
    yield WorkerEnv(broker, url, topics, judge, worker), gateway
    gateway.stop()
    worker.stop()
    judge.stop()


def call(gateway: GatewayProcess, session_id: str, messages: list[dict[str, Any]], **body: Any):
    r = httpx.post(
        gateway.base_url + "/v1/chat/completions",
        json={"model": "policy", "messages": messages, "max_tokens": 16, **body},
        headers={"X-Session-Id": session_id},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r


async def every_row_as_text(env: WorkerEnv) -> str:
    """Every row of every table of the database the gateway and the worker write, as text."""
    tables = await env.db(
        "SELECT table_name FROM information_schema.tables"
        " WHERE table_schema = 'public' AND table_type = 'BASE TABLE'"
    )
    rows = []
    for table in tables:
        rows += await env.db(f'SELECT t::text AS row FROM "{table["table_name"]}" t')
    return "\n".join(r["row"] for r in rows)


def test_a_secret_in_a_message_reaches_no_topic_table_or_judge(stack) -> None:
    env, gateway = stack
    session_id = new_id("secret")
    history = [
        {"role": "system", "content": "You are my assistant."},
        {"role": "user", "content": "Plan my day."},
    ]
    first = call(gateway, session_id, history)
    history += [
        first.json()["choices"][0]["message"],
        {"role": "user", "content": f"thanks! my key is {SECRET}, mail me at {EMAIL}"},
    ]
    second = call(gateway, session_id, history, stream=True)  # as OpenClaw calls
    assert SECRET in str(history) and second.text.endswith("data: [DONE]\n\n")

    # claw.steps: the raw records hold neither, and the step with the secret is not trained
    records = asyncio.run(read_topic(env.bootstrap, env.topics.steps))
    mine = [r for r in records if session_id.encode() in r]
    assert len(mine) == 2
    for raw in records:
        assert SECRET.encode() not in raw and EMAIL.encode() not in raw
    steps = sorted((decode_event(Step, r) for r in mine), key=lambda s: s.turn_index)
    assert steps[1].request.messages[-1].content == (
        "thanks! my key is [REDACTED:api_key], mail me at [REDACTED:email]"
    )
    assert (steps[1].train, steps[1].prompt_token_ids) == (False, [])
    assert (steps[0].train, len(steps[0].prompt_token_ids)) == (True, 2048)
    assert len(steps[1].response_token_ids) == 16  # the answer's tokens, as sampled

    # the judge judged the first turn by the message that followed it, redacted
    async def judged() -> list[Any]:
        env.worker.check()
        return await env.db("SELECT payload FROM judgements WHERE step_id = $1", steps[0].step_id)

    (judgement,) = asyncio.run(wait_for(judged, "the first turn judged"))
    next_state = orjson.loads(judgement["payload"])["turn"]["next_state"]
    assert "[REDACTED:api_key]" in next_state[-1]["content"]
    assert env.judge is not None and env.judge.bodies
    prompts = [m["content"] for body in env.judge.bodies for m in body["messages"]]
    assert any("[next state: user]" in p and "[REDACTED:api_key]" in p for p in prompts)
    assert not any(SECRET in p or EMAIL in p for p in prompts)

    # Postgres: both steps archived (payloads too), and no table holds either
    async def archived() -> list[Any]:
        rows = await env.db("SELECT 1 FROM step_payloads WHERE step_id = $1", steps[1].step_id)
        return rows if rows else []

    asyncio.run(wait_for(archived, "the step with the secret archived"))
    dump = asyncio.run(every_row_as_text(env))
    assert str(steps[1].step_id) in dump and "[REDACTED:email]" in dump
    assert SECRET not in dump and EMAIL not in dump

    metrics = httpx.get(gateway.base_url + "/metrics", timeout=10).text
    assert 'claw_gateway_redactions_total{pattern="api_key"}' in metrics


def test_the_responses_and_messages_doors_redact_alike(stack) -> None:
    env, gateway = stack
    session_id = new_id("doors")
    said = f"my key is {SECRET}, mail me at {EMAIL}"
    for path, body in (
        ("/v1/messages", {"max_tokens": 16, "messages": [{"role": "user", "content": said}]}),
        ("/v1/responses", {"max_output_tokens": 16, "input": said}),
    ):
        r = httpx.post(
            gateway.base_url + path,
            json={"model": "policy", **body},
            headers={"X-Session-Id": session_id},
            timeout=30,
        )
        assert r.status_code == 200, r.text
    records = asyncio.run(read_topic(env.bootstrap, env.topics.steps))
    mine = [decode_event(Step, r) for r in records if session_id.encode() in r]
    assert len(mine) == 2
    for step in mine:
        assert step.request.messages[-1].content == (
            "my key is [REDACTED:api_key], mail me at [REDACTED:email]"
        )
        assert (step.train, step.prompt_token_ids) == (False, [])
    assert not any(SECRET.encode() in r or EMAIL.encode() in r for r in records)
