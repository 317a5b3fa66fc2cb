"""The gateway with the official `openai` client, over the real engine, broker and Postgres."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from ..support.engine import ADMIN_KEY, TOOL_PROMPT, WEATHER_TOOL
from ..support.gateway import (
    OTHER,
    GatewayProcess,
    read_dead_letters,
    read_session_events,
    read_steps,
)
from ..support.processes import free_port
from ..support.service_logs import log_file


@pytest.fixture(scope="module")
def tokenizer(tiny_models):
    return AutoTokenizer.from_pretrained(tiny_models["tools"])


def start_session(gateway: GatewayProcess, api_key: str | None = None) -> dict:
    r = httpx.post(
        gateway.base_url + "/rl/start_session",
        json={"api_key": api_key} if api_key else {},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    )
    assert r.status_code == 200, r.text
    return r.json()


def clients(gateway: GatewayProcess) -> dict[str, tuple[openai.OpenAI, str]]:
    """One client per session convention, with the session id it lands in."""
    session = start_session(gateway)
    path_session = f"path-{uuid.uuid4().hex[:8]}"
    header_session = f"hdr-{uuid.uuid4().hex[:8]}"
    return {
        "api_key": (
            openai.OpenAI(
                base_url=gateway.base_url + "/v1", api_key=session["api_key"], max_retries=0
            ),
            session["session_id"],
        ),
        "path": (
            openai.OpenAI(
                base_url=f"{gateway.base_url}/{path_session}/g1/v1", api_key="x", max_retries=0
            ),
            path_session,
        ),
        "header": (
            openai.OpenAI(
                base_url=gateway.base_url + "/v1",
                api_key="x",
                max_retries=0,
                default_headers={"X-Session-Id": header_session, "X-Turn-Type": "main"},
            ),
            header_session,
        ),
    }


def test_each_convention_and_call_kind_records_exactly_one_exact_step(
    gateway, broker, tokenizer
) -> None:
    seen: dict[
        str, tuple[str, str, list]
    ] = {}  # step id -> (session, text the client saw, tool calls)
    for convention, (client, session_id) in clients(gateway).items():
        raw = client.chat.completions.with_raw_response.create(
            model="policy", messages=OTHER, max_tokens=12
        )
        response = raw.parse()
        assert "token_ids" not in response.choices[0].model_extra  # not asked, so stripped
        assert response.choices[0].logprobs is None
        seen[raw.headers["x-claw-step-id"]] = (
            session_id,
            response.choices[0].message.content or "",
            [],
        )

        with client.chat.completions.with_streaming_response.create(
            model="policy", messages=OTHER, max_tokens=12, stream=True
        ) as raw_stream:
            step_id = raw_stream.headers["x-claw-step-id"]
            chunks = list(raw_stream.parse())
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert all(c.usage is None for c in chunks)  # usage was not asked for
        seen[step_id] = (session_id, text, [])

        raw = client.chat.completions.with_raw_response.create(
            model="policy", messages=TOOL_PROMPT, tools=[WEATHER_TOOL], temperature=0
        )
        response = raw.parse()
        (call,) = response.choices[0].message.tool_calls
        assert call.function.name == "get_weather", convention
        seen[raw.headers["x-claw-step-id"]] = (session_id, "", [call.function.name])

    steps = {str(s.step_id): s for s in read_steps(broker, {v[0] for v in seen.values()})}
    assert set(steps) == set(seen)  # exactly one Step per call, none missing, none extra
    assert len(read_steps(broker, {v[0] for v in seen.values()})) == len(seen)
    for step_id, (session_id, text, tools) in seen.items():
        step = steps[step_id]
        assert step.session_id == session_id
        assert len(step.response_logprobs) == len(step.response_token_ids) > 0
        decoded = tokenizer.decode(step.response_token_ids, skip_special_tokens=True)
        if tools:
            assert [c.function.name for c in step.response.message.tool_calls] == tools
            assert "<tool_call>" in decoded
        else:
            assert decoded == text
            assert (step.response.message.content or "") == text
    turn_indexes = sorted(
        s.turn_index for s in steps.values() if s.session_id == next(iter(seen.values()))[0]
    )
    assert turn_indexes == [0, 1, 2]
    path_steps = [s for s in steps.values() if s.session_id.startswith("path-")]
    assert {s.group_id for s in path_steps} == {"g1"}


def test_client_asking_for_token_ids_and_logprobs_gets_them(gateway, tokenizer) -> None:
    client, _ = clients(gateway)["header"]
    response = client.chat.completions.create(
        model="policy",
        messages=OTHER,
        max_tokens=8,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    ids = response.choices[0].model_extra["token_ids"]
    assert len(response.choices[0].logprobs.content) == len(ids)
    assert response.model_extra["prompt_token_ids"]


def test_body_session_fields_are_stripped_and_session_done_ends_it(gateway, broker) -> None:
    session_id = f"body-{uuid.uuid4().hex[:8]}"
    r = httpx.post(
        gateway.base_url + "/v1/chat/completions",
        json={
            "model": "policy",
            "messages": OTHER,
            "max_tokens": 4,
            "session_id": session_id,
            "turn_type": "side",
            "session_done": True,
        },
        timeout=60,
    )
    assert r.status_code == 200, r.text
    (step,) = read_steps(broker, {session_id})
    assert step.turn_type == "side"
    assert "session_id" not in step.request.extra and "session_done" not in step.request.extra
    kinds = [e.kind for e in read_session_events(broker, {session_id})]
    assert kinds == ["started", "ended"]


def test_session_routes_publish_events_and_refresh_rebinds_the_key(gateway, broker) -> None:
    first = start_session(gateway)
    key = first["api_key"]
    auth = {"Authorization": f"Bearer {key}"}
    r = httpx.post(gateway.base_url + "/rl/set_reward", json={"reward": 0.5}, headers=auth)
    assert r.status_code == 200 and r.json()["session_id"] == first["session_id"]
    r = httpx.post(
        gateway.base_url + "/rl/feedback", json={"score": -1, "text": "too long"}, headers=auth
    )
    assert r.status_code == 200
    second = start_session(gateway, api_key=key)  # refresh: same key, new session
    assert second["api_key"] == key and second["session_id"] != first["session_id"]
    assert second["ended_session_id"] == first["session_id"]
    r = httpx.post(gateway.base_url + "/rl/end_session", json={}, headers=auth)
    assert r.json()["session_id"] == second["session_id"]
    events = read_session_events(broker, {first["session_id"], second["session_id"]})
    assert [(e.session_id == first["session_id"], e.kind) for e in events] == [
        (True, "started"),
        (True, "reward"),
        (True, "feedback"),
        (True, "refreshed"),
        (False, "started"),
        (False, "ended"),
    ]
    assert events[1].reward == 0.5 and events[2].score == -1 and events[2].text == "too long"


@pytest.mark.parametrize(
    ("route", "body", "headers", "status", "words"),
    [
        ("/rl/set_reward", {"reward": "lots", "session_id": "x"}, {}, 422, "reward"),
        ("/rl/set_reward", {"reward": 1e9, "session_id": "x"}, {}, 422, "less than or equal"),
        ("/rl/set_reward", {"reward": 1.0, "session_id": "never-seen"}, {}, 404, "unknown session"),
        ("/rl/feedback", {"score": 2, "session_id": "x"}, {}, 422, "score"),
        ("/rl/feedback", {"session_id": "x"}, {}, 422, "score"),
        (
            "/rl/set_reward",
            {"reward": 1.0},
            {"Authorization": "Bearer claw-sk-nope"},
            401,
            "invalid API key",
        ),
        ("/rl/start_session", {}, {"Authorization": "Bearer not-admin"}, 401, "admin key"),
        ("/v1/chat/completions", {"model": "policy", "messages": "hi"}, {}, 422, "messages"),
        ("/v1/chat/completions", {"model": "policy", "messages": []}, {}, 422, "messages"),
        ("/v1/chat/completions", {"messages": OTHER}, {}, 422, "model"),
        (
            "/v1/chat/completions",
            {"model": "policy", "messages": OTHER},
            {"Authorization": "Bearer claw-sk-x"},
            401,
            "invalid API key",
        ),
    ],
)
def test_bad_input_gets_openai_shaped_errors(gateway, route, body, headers, status, words) -> None:
    r = httpx.post(gateway.base_url + route, json=body, headers=headers, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    assert words in error["message"] or words == error["param"]


def test_reward_nan_and_bad_json_and_huge_bodies(gateway) -> None:
    nan = httpx.post(
        gateway.base_url + "/rl/set_reward",
        content=b'{"reward": NaN, "session_id": "x"}',
        headers={"content-type": "application/json"},
    )
    assert nan.status_code == 422
    bad = httpx.post(
        gateway.base_url + "/v1/chat/completions",
        content=b"{oops",
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
    huge = httpx.post(
        gateway.base_url + "/v1/chat/completions",
        content=b'{"x": "' + b"a" * (17 * 1024 * 1024) + b'"}',
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert huge.status_code == 413


def test_no_backend_answers_503_with_retry_after(broker, database, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    proc = GatewayProcess(broker, database, [dead], tmp_path)
    try:
        r = httpx.post(
            proc.base_url + "/v1/chat/completions",
            json={"model": "policy", "messages": OTHER},
            timeout=30,
        )
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "ServiceUnavailableError"
    finally:
        proc.stop()


def test_a_client_leaving_mid_stream_frees_the_backend(gateway) -> None:
    """The stream stops being relayed (and its engine request is released) when the client
    hangs up; the gateway goes on serving."""

    body = {"model": "policy", "messages": OTHER, "max_tokens": 256, "stream": True}
    with (
        httpx.Client(base_url=gateway.base_url, timeout=30) as client,
        client.stream(
            "POST", "/v1/chat/completions", json=body, headers={"X-Session-Id": "leaver"}
        ) as r,
    ):
        assert r.status_code == 200
        next(r.iter_raw())  # the first chunk, then hang up
    deadline = time.monotonic() + 30
    while True:
        backends = httpx.get(gateway.base_url + "/healthz").json()["backends"]
        if all(b["inflight"] == 0 for b in backends):
            break
        assert time.monotonic() < deadline, f"the backend stays busy: {backends}"
        time.sleep(0.1)
    again = httpx.post(
        gateway.base_url + "/v1/chat/completions",
        json={**body, "stream": False, "max_tokens": 4},
        timeout=30,
    )
    assert again.status_code == 200


def counted_steps(database: str, session_id: str) -> int:
    import asyncio

    import asyncpg

    from claw_stream.store.db import asyncpg_dsn

    async def read() -> int:
        conn = await asyncpg.connect(asyncpg_dsn(database))
        try:
            return await conn.fetchval(
                "SELECT n_steps FROM sessions WHERE session_id = $1", session_id
            )
        finally:
            await conn.close()

    return asyncio.run(read())


def test_a_call_that_makes_no_step_gives_its_turn_index_back(gateway, broker, database) -> None:
    """An engine's refusal makes no Step: the session's next call takes that turn index and
    the session's end counts only its Steps, so the stitcher waits for no Step that never
    comes."""
    session = f"gap-{uuid.uuid4().hex[:8]}"
    headers = {"X-Session-Id": session}
    url = gateway.base_url + "/v1/chat/completions"
    call = {"model": "policy", "messages": OTHER, "max_tokens": 4}
    assert httpx.post(url, json=call, headers=headers, timeout=60).status_code == 200
    refused = httpx.post(url, json={**call, "model": "no-such-model@v99"}, headers=headers)
    assert refused.status_code == 404
    assert counted_steps(database, session) == 1  # given back before the client got its answer
    assert httpx.post(url, json=call, headers=headers, timeout=60).status_code == 200
    auth = {**headers, "Authorization": f"Bearer {ADMIN_KEY}"}
    assert httpx.post(gateway.base_url + "/rl/end_session", json={}, headers=auth).is_success
    assert [s.turn_index for s in read_steps(broker, {session})] == [0, 1]
    ended = read_session_events(broker, {session})[-1]
    assert (ended.kind, ended.n_steps) == ("ended", 2)


@pytest.fixture(scope="module")
def faulty_gateway(broker, database, tmp_path_factory) -> Iterator[GatewayProcess]:
    """A gateway in front of `tests.support.faulty_engine`, which answers with what cannot make
    a Step, or stalls mid-stream."""
    port = free_port()
    log = log_file("faulty_gateway", tmp_path_factory.mktemp("faulty")).open("ab")
    engine = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tests.support.faulty_engine:app", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    proc = None
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the faulty engine did not start"
                time.sleep(0.1)
        proc = GatewayProcess(
            broker, database, [f"http://127.0.0.1:{port}"], tmp_path_factory.mktemp("faulty")
        )
        yield proc
    finally:
        if proc is not None:
            proc.stop()
        engine.terminate()
        engine.wait(timeout=10)
        log.close()


def test_a_client_leaving_mid_stream_gives_its_turn_index_back(
    faulty_gateway: GatewayProcess, database
) -> None:
    """The engine stalls after its first chunk (so no race with a fast model finishing first);
    the client hangs up; the call made no Step, so its turn index is given back."""
    session = f"left-{uuid.uuid4().hex[:8]}"
    body = {"model": "policy", "messages": [{"role": "user", "content": "stall"}], "stream": True}
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST",
            faulty_gateway.base_url + "/v1/chat/completions",
            json=body,
            headers={"X-Session-Id": session},
        ) as r,
    ):
        assert r.status_code == 200
        next(r.iter_raw())  # the first chunk, then hang up
    deadline = time.monotonic() + 30
    # the row exists (None: the call was never counted) and counts no call
    while counted_steps(database, session) != 0:
        assert time.monotonic() < deadline, "the stream the client left stays counted"
        time.sleep(0.1)


def test_answers_that_cannot_make_a_step_reach_the_client_and_the_dead_letter_topic(
    faulty_gateway: GatewayProcess, broker, database
) -> None:
    """The client still gets what the engine said; the call is kept whole on claw.dlq, with
    the reason, and no Step is invented from it (nor counted in its session)."""
    session = f"faulty-{uuid.uuid4().hex[:8]}"
    client = openai.OpenAI(
        base_url=faulty_gateway.base_url + "/v1",
        api_key="unused",
        default_headers={"X-Session-Id": session},
    )
    answer = client.chat.completions.create(model="policy", messages=OTHER)
    assert answer.choices[0].message.content == "two tokens"
    chunks = list(client.chat.completions.create(model="policy", messages=OTHER, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "half"
    assert chunks[-1].choices[0].finish_reason == "stop"

    letters = read_dead_letters(broker, {session})
    assert len(letters) == 2
    assert {(d.processor, d.source_topic) for d in letters} == {("gateway", "claw.steps")}
    assert "one per sampled token" in letters[0].error
    assert "unreadable stream chunk" in letters[1].error
    kept = json.loads(letters[1].value)
    assert kept["request"]["messages"] == OTHER and "response" in kept
    assert read_steps(broker, {session}) == []
    assert counted_steps(database, session) == 0  # nothing for the stitcher to wait for


def test_a_dead_letter_holds_the_clients_body_redacted(
    faulty_gateway: GatewayProcess, broker
) -> None:
    """A call that cannot make a Step is kept on claw.dlq with its body, its secrets redacted
    as a Step's would be."""
    session = f"faulty-{uuid.uuid4().hex[:8]}"
    secret, email = "sk-proj-Q7wE9rT1yU3iO5pA8sD2fG4hJ6kL0zX", "jane.doe@example.org"
    messages = [{"role": "user", "content": f"my key is {secret}, mail {email}"}]
    r = httpx.post(
        faulty_gateway.base_url + "/v1/chat/completions",
        json={"model": "policy", "messages": messages},
        headers={"X-Session-Id": session},
        timeout=30,
    )
    assert r.status_code == 200  # the client still gets what the engine said
    (letter,) = read_dead_letters(broker, {session})
    assert secret not in letter.value and email not in letter.value
    kept = json.loads(letter.value)
    assert kept["request"]["messages"][0]["content"] == (
        "my key is [REDACTED:api_key], mail [REDACTED:email]"
    )
