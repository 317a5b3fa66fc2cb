"""Claude Code, Codex and OpenClaw through the Messages, Responses and chat doors, as they
really call: their recorded requests (tests/fixtures/agents/) replayed stream and not against a
real gateway, engine, broker and Postgres (the agents themselves run in
tests/e2e/test_coding_agents.py).

The engine serves a tiny model of 32k context (`long_model`): their 9-12k-token prompts fit,
and the Step's token ids can be checked against the engine's own tokenizer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from ..support.engine import ADMIN_KEY, EngineProcess
from ..support.gateway import GatewayProcess, check_exact_tokens, read_steps
from ..support.paths import AGENTS

KEY = ("--key", "any-key")
DROPPED = {"content-length", "accept-encoding", "connection", "host"}


def recorded(agent: str) -> list[dict[str, Any]]:
    lines = (AGENTS / agent / "requests.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def as_session(record: dict[str, Any], session: str) -> tuple[dict[str, str], dict[str, Any]]:
    """A recorded request's headers and body, naming `session` where the agent named its own."""
    headers = {k: v for k, v in record["headers"].items() if k.lower() not in DROPPED}
    body = json.loads(json.dumps(record["body"]))
    for name in ("X-Claude-Code-Session-Id", "session-id"):
        if name in headers:
            headers[name] = session
    if "x-codex-turn-metadata" in headers:
        metadata = json.loads(headers["x-codex-turn-metadata"])
        headers["x-codex-turn-metadata"] = json.dumps(metadata | {"session_id": session})
    if "metadata" in body:
        user_id = json.loads(body["metadata"]["user_id"])
        body["metadata"]["user_id"] = json.dumps(user_id | {"session_id": session})
    headers["Authorization"] = "Bearer any-key"
    return headers, body


def sse(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def answer_text(agent: str, response: httpx.Response, stream: bool) -> str:
    """The reply as the agent's client reads it, checking the stream's shape on the way."""
    if agent == "claude-code":
        if not stream:
            return "".join(b["text"] for b in response.json()["content"] if b["type"] == "text")
        events = sse(response.text)
        kinds = [e["type"] for e in events]
        assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
        assert events[-2]["delta"]["stop_reason"] == "end_turn"
        return "".join(
            e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta"
        )
    if not stream:
        output = response.json()["output"]
    else:
        events = sse(response.text)
        assert (
            events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
        )
        completed = events[-1]["response"]
        assert completed["id"] and completed["usage"]["input_tokens"] > 0
        output = completed["output"]
    return "".join(
        part["text"] for item in output if item["type"] == "message" for part in item["content"]
    )


@pytest.fixture(scope="module")
def tokenizer(long_model: Path) -> Any:
    return AutoTokenizer.from_pretrained(long_model)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("agent", ["claude-code", "codex"])
def test_every_recorded_request_is_answered_and_one_step_with_exact_tokens(
    long_gateway: GatewayProcess,
    long_engine: EngineProcess,
    tokenizer: Any,
    agent: str,
    stream: bool,
) -> None:
    session = str(uuid.uuid4())
    answers = []
    for record in recorded(agent):
        headers, body = as_session(record, session)
        body["stream"] = stream
        response = httpx.post(
            long_gateway.base_url + record["path"], json=body, headers=headers, timeout=120
        )
        assert response.status_code == 200, response.text
        answers.append(answer_text(agent, response, stream))
    # their own session ids name the session: every call of the agent is one session
    steps = read_steps(long_gateway.bootstrap, {f"{agent}-{session}"})
    assert len(steps) == len(answers)
    for step, text in zip(steps, answers, strict=True):
        # sampled at the agents' temperature (1): the tiny model now and then ends at once
        # (seen 2 of 12 runs), so what was said is held to the tokens below, not to a length
        assert step.response_token_ids
        assert step.turn_type == "main" and step.train, step.request.extra
        check_exact_tokens(long_engine, step, tokenizer, text)
    door = steps[0].request.extra["claw_door"]
    if agent == "codex":  # built-in web search is left out, and the Step says so
        assert door["left_out_tools"] == ["web_search"]
        assert len(steps[0].request.tools or ()) == 12  # 7 functions + the 5 of a namespace
    else:  # system messages where Claude Code put them; its 12 tools; its thinking setting
        assert [m.role for m in steps[0].request.messages] == ["system", "user", "system"]
        assert len(steps[0].request.tools or ()) == 12
        assert steps[0].request.extra["chat_template_kwargs"] == {"enable_thinking": True}
        # 32,000 tokens asked for, lowered to the room the prompt leaves in 32k
        assert steps[0].request.sampling.max_tokens == 32768 - len(steps[0].prompt_token_ids)


def test_openclaws_full_profile_is_answered_on_a_model_of_32k(
    long_gateway: GatewayProcess, long_engine: EngineProcess, tokenizer: Any
) -> None:
    """What `claw-stream connect openclaw` writes for a model of 32k context or more: the full
    profile, whose real first request (12 tools, ~12.7k tokens) such a model holds."""
    record = json.loads((AGENTS / "openclaw" / "session.jsonl").read_text().splitlines()[0])
    session = uuid.uuid4().hex[:12]
    body = json.loads(json.dumps(record["body"]).replace("agent-s1", session))
    body.pop("stream_options")
    body["stream"] = False
    headers = {k: v for k, v in record["headers"].items() if k.lower() not in DROPPED}
    response = httpx.post(
        long_gateway.base_url + "/v1/chat/completions", json=body, headers=headers, timeout=300
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["choices"][0]["finish_reason"] in ("stop", "tool_calls")
    assert answer["usage"]["prompt_tokens"] > 12_000
    # no session header: OpenClaw's runtime line names the session
    (step,) = read_steps(long_gateway.bootstrap, {f"openclaw-{session}"})
    assert step.turn_type == "main" and len(step.request.tools or ()) == 12
    text = answer["choices"][0]["message"]["content"] or ""
    check_exact_tokens(long_engine, step, tokenizer, text)


def test_codex_side_requests_and_stronger_session_names(long_gateway: GatewayProcess) -> None:
    record = recorded("codex")[0]
    session = str(uuid.uuid4())
    headers, body = as_session(record, session)
    metadata = json.loads(headers["x-codex-turn-metadata"])
    headers["x-codex-turn-metadata"] = json.dumps(metadata | {"request_kind": "compaction"})
    body["stream"] = False
    r = httpx.post(long_gateway.base_url + "/v1/responses", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    (step,) = read_steps(long_gateway.bootstrap, {f"codex-{session}"})
    assert step.turn_type == "side"  # a compaction is not the user's turn
    # X-Session-Id (OpenClaw-RL's convention) names the session over the agent's own id
    headers, body = as_session(record, session)
    body["stream"] = False
    named = f"named-{uuid.uuid4().hex[:8]}"
    r = httpx.post(
        long_gateway.base_url + "/v1/responses",
        json=body,
        headers=headers | {"X-Session-Id": named},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert len(read_steps(long_gateway.bootstrap, {named})) == 1
    # a session key keeps its own session: the agent's id is no claim on another
    started = httpx.post(
        long_gateway.base_url + "/rl/start_session",
        json={},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    ).json()
    headers["Authorization"] = f"Bearer {started['api_key']}"
    r = httpx.post(long_gateway.base_url + "/v1/responses", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    assert len(read_steps(long_gateway.bootstrap, {started["session_id"]})) == 1


def test_count_tokens_is_what_the_engine_prefills(long_gateway: GatewayProcess) -> None:
    record = recorded("claude-code")[0]
    session = str(uuid.uuid4())
    headers, body = as_session(record, session)
    counted = httpx.post(
        long_gateway.base_url + "/v1/messages/count_tokens?beta=true",
        json={k: v for k, v in body.items() if k not in ("max_tokens", "stream")},
        headers=headers,
        timeout=60,
    )
    assert counted.status_code == 200, counted.text
    body["stream"] = False
    r = httpx.post(long_gateway.base_url + record["path"], json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    (step,) = read_steps(long_gateway.bootstrap, {f"claude-code-{session}"})
    assert counted.json() == {"input_tokens": len(step.prompt_token_ids)}
    assert r.json()["usage"]["input_tokens"] == len(step.prompt_token_ids)
    bad = httpx.post(
        long_gateway.base_url + "/v1/messages/count_tokens", json={"model": "m"}, timeout=60
    )
    assert bad.status_code == 400 and bad.json()["type"] == "error", bad.text


def test_a_prompt_too_long_gets_the_context_error_each_client_knows(
    gateway: GatewayProcess,
) -> None:
    """On a 512-token model: Anthropic's words for Claude Code, OpenAI's code for Codex (in
    the stream's `response.failed`, the only place Codex looks for it)."""
    headers, body = as_session(recorded("claude-code")[0], str(uuid.uuid4()))
    r = httpx.post(
        gateway.base_url + "/v1/messages?beta=true", json=body, headers=headers, timeout=60
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("prompt is too long: ") and error["message"].endswith(
        " tokens > 512 maximum"
    )
    headers, body = as_session(recorded("codex")[0], str(uuid.uuid4()))
    r = httpx.post(gateway.base_url + "/v1/responses", json=body, headers=headers, timeout=60)
    assert r.status_code == 200
    failed = sse(r.text)[-1]
    assert failed["type"] == "response.failed"
    assert failed["response"]["error"]["code"] == "context_length_exceeded"
    r = httpx.post(
        gateway.base_url + "/v1/responses",
        json=body | {"stream": False},
        headers=headers,
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    # the doctor names both agents, and a context that would hold their prompts
    doctor = subprocess.run(
        [sys.executable, "-m", "claw_stream", "doctor", "--base-url", gateway.base_url],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert doctor.returncode == 1
    (line,) = [line for line in doctor.stdout.splitlines() if "agents' prompts" in line]
    assert "claude-code: 1 call(s) refused" in line and "codex: 2 call(s) refused" in line, line
    assert "tokens of context holds them" in line
