"""A model we cannot train behind the gateway: a hosted OpenAI-compatible API that demands its
key (a local stand-in). Its answers reach the agent unchanged, in JSON and in a stream; its
Steps carry no token ids and make no sample, but they are archived and judged, and the user's
correction becomes a skill that the API is sent on the next session: learning without
training."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import httpx
import pytest
from openai import OpenAI

from claw_stream.events import Step, decode_event
from claw_stream.skills.text import OPEN
from claw_stream.store.db import asyncpg_dsn

from ..support import topic_reads
from ..support.engine import ADMIN_KEY
from ..support.gateway import GatewayProcess
from ..support.hosted_api import MODEL, HostedApi
from ..support.worker import private_worker, topics_env

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
API_KEY = "sk-hosted-test-key"


@pytest.fixture(scope="module")
def hosted(broker, postgres, tmp_path_factory) -> Iterator[Any]:
    data = tmp_path_factory.mktemp("hosted")
    api = HostedApi(API_KEY)
    on = {"CLAW_SKILLS__ENABLED": "true", "CLAW_SKILLS__REFRESH_S": "0.2"}
    worker, topics, url = asyncio.run(
        private_worker(
            broker, postgres, data / "worker", "hosted", env=on, rewards='[{"use": "reaction"}]'
        )
    )
    gateway = GatewayProcess(
        broker,
        url,
        [api.url],
        data,
        env={
            **topics_env(topics),
            **on,
            "CLAW_WORKER__APP_ID": worker.env["CLAW_WORKER__APP_ID"],
            "CLAW_GATEWAY__BACKEND_KIND": "hosted",
            "CLAW_GATEWAY__BACKEND_API_KEY": API_KEY,
            "CLAW_GATEWAY__HEALTH_INTERVAL_S": "0.5",
        },
    )
    yield api, gateway, worker, topics, url
    gateway.stop()
    worker.stop()
    api.stop()


def _steps(broker: str, topic: str, session_id: str) -> list[Step]:
    records = asyncio.run(topic_reads.records(broker, topic))
    return [decode_event(Step, r.value) for r in records if r.key == session_id.encode()]


def _start(gateway: GatewayProcess, tenant: str) -> tuple[str, str]:
    r = httpx.post(gateway.base_url + "/rl/start_session", json={"tenant": tenant}, headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json()["session_id"], r.json()["api_key"]


def test_a_hosted_api_answers_through_the_gateway_with_its_own_key(hosted, broker) -> None:
    api, gateway, _, topics, _ = hosted
    try:
        sid, key = _start(gateway, f"h{uuid.uuid4().hex[:8]}")
        client = OpenAI(base_url=gateway.base_url + "/v1", api_key=key, max_retries=0)
        answer = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=16
        )
        assert answer.choices[0].message.content == api.answer
        streamed = client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=16,
            stream=True,
        )
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        assert text.strip() == api.answer
        # the API got the call as the client sent it, named as it serves it, with our key
        sent = api.requests[-2:]
        assert [b["model"] for b in sent] == [MODEL, MODEL]
        assert all("return_token_ids" not in b and "logprobs" not in b for b in sent)
        steps = _steps(broker, topics.steps, sid)
        assert len(steps) == 2
        for step in steps:
            assert step.prompt_token_ids == [] and step.response_token_ids == []
            assert step.response_logprobs == [] and step.served_model == MODEL
            assert step.response.message.content.strip() == api.answer
            assert step.usage.completion_tokens == len(api.answer.split())
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- gateway log ---\n{gateway.log()[-3000:]}") from None


def test_a_hosted_models_users_teach_it_skills_it_is_sent(hosted, broker) -> None:
    api, gateway, worker, _, url = hosted
    tenant = f"h{uuid.uuid4().hex[:8]}"
    try:
        sid, key = _start(gateway, tenant)
        client = OpenAI(base_url=gateway.base_url + "/v1", api_key=key, max_retries=0)
        first = [{"role": "user", "content": "What does a compiler do?"}]
        client.chat.completions.create(model="default", messages=first)
        reply = "That is too long. Please answer in under 30 words. Why is the sky blue?"
        client.chat.completions.create(
            model="default",
            messages=[
                *first,
                {"role": "assistant", "content": api.answer},
                {"role": "user", "content": reply},
            ],
        )
        ended = httpx.post(
            gateway.base_url + "/rl/end_session",
            json={},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert ended.status_code == 200, ended.text

        async def judged_and_learned() -> tuple[int, int, list[str]]:
            conn = await asyncpg.connect(asyncpg_dsn(url))
            try:
                deadline = time.monotonic() + 90
                while True:
                    judged = await conn.fetchval(
                        "SELECT count(*) FROM judgements WHERE session_id = $1", sid
                    )
                    samples = await conn.fetchval(
                        "SELECT count(*) FROM samples WHERE session_id = $1"
                        " AND status <> 'no_signal'",
                        sid,
                    )
                    skills = await conn.fetch(
                        "SELECT text FROM skills WHERE scope = $1", f"tenant:{tenant}"
                    )
                    if judged == 2 and skills:
                        return judged, samples, [r["text"] for r in skills]
                    if time.monotonic() > deadline:
                        raise AssertionError(
                            f"after 90 s: {judged} of 2 turns judged, skills {list(skills)}"
                        )
                    await asyncio.sleep(0.2)
            finally:
                await conn.close()

        _, samples, skills = asyncio.run(judged_and_learned())
        assert skills == ["Answer in under 30 words."]
        assert samples == 0  # no token ids: nothing to train, ever
        _, again = _start(gateway, tenant)
        OpenAI(
            base_url=gateway.base_url + "/v1", api_key=again, max_retries=0
        ).chat.completions.create(
            model="default", messages=[{"role": "user", "content": "What is an API?"}]
        )
        sent = api.requests[-1]["messages"]
        assert OPEN in json.dumps(sent) and "Answer in under 30 words." in sent[0]["content"]
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\n--- worker log ---\n{worker.log()}\n--- gateway log ---\n"
            f"{gateway.log()[-3000:]}"
        ) from None


def test_a_wrong_key_for_the_hosted_api_is_its_own_error_to_the_client(hosted, broker) -> None:
    """The gateway passes the API's refusal on in the client's shape (a misconfigured key
    is the operator's to fix, and the client is told what the API said)."""
    api, gateway, _, _, _ = hosted
    good = api.key
    api.key = "sk-rotated"
    try:
        _, key = _start(gateway, f"h{uuid.uuid4().hex[:8]}")
        r = httpx.post(
            gateway.base_url + "/v1/chat/completions",
            json={"model": "default", "messages": [{"role": "user", "content": "Hi"}]},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert r.status_code == 401, r.text
        assert r.json()["error"]["code"] == "invalid_api_key"
    finally:
        api.key = good
