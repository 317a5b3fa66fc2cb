"""What opencode, aider and Hermes Agent really sent (tests/fixtures/agents/), replayed through
the chat completions door of a real gateway before the real engine, streamed as they were and
whole: each call answered and one Step, whose prompt ids are the engine's own tokenization of
what was sent and whose answer ids are the text the agent received; opencode's title call a
side call (no tools), every other call the main line.

The engine serves a tiny model of 32k context (`long_model`): Hermes Agent's 15k-token prompt
and its 8k answer limit fit."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from ..support.engine import EngineProcess
from ..support.gateway import GatewayProcess, check_exact_tokens, read_steps
from ..support.paths import AGENTS

DROPPED = {"content-length", "accept-encoding", "connection", "host"}
# (agent, calls recorded, tools of each)
RECORDED = {"opencode": [0, 10], "aider": [0], "hermes": [28]}


def recorded(agent: str) -> list[dict[str, Any]]:
    lines = (AGENTS / agent / "requests.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def as_session(record: dict[str, Any], session: str) -> tuple[dict[str, str], str]:
    """A recorded request's headers naming `session`: opencode's own id replaced (the session
    is then `opencode-<id>`), else by X-Session-Id; and the session its Steps go to."""
    headers = {k: v for k, v in record["headers"].items() if k.lower() not in DROPPED}
    headers["Authorization"] = "Bearer any-key"
    if "x-session-id" in headers:
        headers["x-session-id"] = headers["x-session-affinity"] = session
        return headers, f"opencode-{session}"
    return headers | {"X-Session-Id": session}, session


def streamed_text(response: httpx.Response, body: dict[str, Any]) -> str:
    chunks = [
        json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")
    ]
    assert response.text.rstrip().endswith("data: [DONE]")
    if (body.get("stream_options") or {}).get("include_usage"):  # opencode's, Hermes Agent's
        assert chunks[-1]["usage"]["prompt_tokens"] > 0
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


@pytest.fixture(scope="module")
def tokenizer(long_model: Path) -> Any:
    return AutoTokenizer.from_pretrained(long_model)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("agent", sorted(RECORDED))
def test_each_recorded_call_is_one_step_with_exact_tokens(
    long_gateway: GatewayProcess,
    long_engine: EngineProcess,
    tokenizer: Any,
    agent: str,
    stream: bool,
) -> None:
    session = f"ses_{uuid.uuid4().hex[:20]}"
    answers, named = [], ""
    for record in recorded(agent):
        headers, named = as_session(record, session)
        body = json.loads(json.dumps(record["body"]))
        body["stream"] = stream
        if not stream:
            body.pop("stream_options", None)
        response = httpx.post(
            long_gateway.base_url + record["path"], json=body, headers=headers, timeout=300
        )
        assert response.status_code == 200, response.text
        assert response.headers["x-claw-session-id"] == named
        if stream:
            answers.append(streamed_text(response, body))
        else:
            answers.append(response.json()["choices"][0]["message"]["content"] or "")
    steps = read_steps(long_gateway.bootstrap, {named})
    assert [len(s.request.tools or ()) for s in steps] == RECORDED[agent]
    for step, text in zip(steps, answers, strict=True):
        assert step.response_token_ids and step.train
        check_exact_tokens(long_engine, step, tokenizer, text)
        # opencode's title call (no tools) is a side call; the agents' turns the main line
        assert step.turn_type == (
            "side" if not step.request.tools and agent == "opencode" else "main"
        )
    if agent == "hermes":  # its answer limit as connect wrote it, which the prompt leaves room for
        assert steps[0].request.sampling.max_tokens == 8192
        assert len(steps[0].prompt_token_ids) > 14_000
