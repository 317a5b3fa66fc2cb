"""OpenAI's Responses API and Anthropic's Messages API through the official SDKs, stream and
not, with a tool round trip: one Step per call, whose token ids decode to what the client saw;
bad input in each API's own error shape. Real gateway, engine, broker and Postgres."""

from __future__ import annotations

import json
import uuid

import anthropic
import httpx
import openai
import pytest
from transformers import AutoTokenizer

from ..support.engine import TOOL_ANSWER, TOOL_PROMPT, WEATHER_TOOL
from ..support.gateway import GatewayProcess, read_steps

QUESTION = TOOL_PROMPT[0]["content"]
FN = WEATHER_TOOL["function"]
RESPONSES_TOOL = {"type": "function", **FN}
ANTHROPIC_TOOL = {
    "name": FN["name"],
    "description": FN["description"],
    "input_schema": FN["parameters"],
}


@pytest.fixture(scope="module")
def tokenizer(tiny_models):
    return AutoTokenizer.from_pretrained(tiny_models["tools"])


def decoded(tokenizer, step) -> str:
    return tokenizer.decode(step.response_token_ids, skip_special_tokens=True)


def session() -> str:
    return f"fd-{uuid.uuid4().hex[:8]}"


# --- Responses ------------------------------------------------------------------------------


def test_responses_tool_round_trip_with_previous_response_id(
    gateway: GatewayProcess, tokenizer
) -> None:
    sid = session()
    client = openai.OpenAI(
        base_url=f"{gateway.base_url}/{sid}/g/v1", api_key="unused", max_retries=0
    )
    first = client.responses.create(
        model="default", input=QUESTION, tools=[RESPONSES_TOOL], temperature=0
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert first.model == "default" and first.status == "completed"
    second = client.responses.create(
        model="default",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[RESPONSES_TOOL],
        max_output_tokens=6,
    )
    assert second.previous_response_id == first.id
    steps = read_steps(gateway.bootstrap, {sid})
    assert [f"resp_{s.step_id.hex}" for s in steps] == [first.id, second.id]
    assert decoded(tokenizer, steps[0]) == TOOL_ANSWER
    assert steps[0].response.message.tool_calls[0].function.name == "get_weather"
    # the chain: the first call's question and answer, then the tool's result
    roles = [(m.role, m.content) for m in steps[1].request.messages]
    assert roles[0] == ("user", QUESTION) and roles[-1] == ("tool", "sunny")
    assert steps[1].request.messages[1].tool_calls[0].id == call.call_id
    assert decoded(tokenizer, steps[1]) == second.output_text
    assert second.usage.output_tokens == len(steps[1].response_token_ids)


def test_responses_stream_events(gateway: GatewayProcess, tokenizer) -> None:
    sid = session()
    client = openai.OpenAI(
        base_url=gateway.base_url + "/v1",
        api_key="unused",
        max_retries=0,
        default_headers={"X-Session-Id": sid},
    )
    events = list(
        client.responses.create(
            model="gpt-4o", input="Tell me something.", max_output_tokens=8, stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == text
    tools = list(
        client.responses.create(
            model="gpt-4o", input=QUESTION, tools=[RESPONSES_TOOL], stream=True, temperature=0
        )
    )
    done = [e.item for e in tools if e.type == "response.output_item.done"]
    assert [(i.type, i.name, json.loads(i.arguments)) for i in done] == [
        ("function_call", "get_weather", {"city": "Paris"})
    ]
    steps = read_steps(gateway.bootstrap, {sid})
    assert [f"resp_{s.step_id.hex}" for s in steps] == [final.id, tools[-1].response.id]
    assert decoded(tokenizer, steps[0]) == text
    assert decoded(tokenizer, steps[1]) == TOOL_ANSWER
    assert steps[0].request.messages[0].content == "Tell me something."


# --- Messages -------------------------------------------------------------------------------


def test_messages_tool_round_trip_and_system(gateway: GatewayProcess, tokenizer) -> None:
    sid = session()
    client = anthropic.Anthropic(
        base_url=f"{gateway.base_url}/{sid}/g", api_key="unused", max_retries=0
    )
    first = client.messages.create(
        model="my-claude",
        max_tokens=64,
        messages=[{"role": "user", "content": QUESTION}],
        tools=[ANTHROPIC_TOOL],
        extra_body={"temperature": 0},  # this SDK version has no temperature
    )
    assert first.stop_reason == "tool_use" and first.model == "my-claude"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
    second = client.messages.create(
        model="my-claude",
        max_tokens=6,
        system="You are terse.",
        messages=[
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
            },
        ],
        tools=[ANTHROPIC_TOOL],
    )
    assert second.stop_reason in ("end_turn", "max_tokens")
    steps = read_steps(gateway.bootstrap, {sid})
    assert [f"msg_{s.step_id.hex}" for s in steps] == [first.id, second.id]
    assert {s.group_id for s in steps} == {"g"}
    assert decoded(tokenizer, steps[0]) == TOOL_ANSWER
    messages = steps[1].request.messages
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[0].content == "You are terse." and messages[3].content == "sunny"
    assert messages[2].tool_calls[0].id == use.id == messages[3].tool_call_id
    text = "".join(b.text for b in second.content if b.type == "text")
    assert decoded(tokenizer, steps[1]) == text
    assert second.usage.output_tokens == len(steps[1].response_token_ids)


def test_messages_stream_events(gateway: GatewayProcess, tokenizer) -> None:
    sid = session()
    client = anthropic.Anthropic(
        base_url=gateway.base_url,
        api_key="unused",
        max_retries=0,
        default_headers={"X-Session-Id": sid},
    )
    with client.messages.stream(
        model="claude-haiku", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        kinds = [event.type for event in stream]
        text = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "message_delta" in kinds
    raw = list(
        client.messages.create(
            model="claude-haiku",
            max_tokens=64,
            messages=[{"role": "user", "content": QUESTION}],
            tools=[ANTHROPIC_TOOL],
            extra_body={"temperature": 0},  # this SDK version has no temperature
            stream=True,
        )
    )
    starts = [e.content_block for e in raw if e.type == "content_block_start"]
    assert [(b.type, b.name) for b in starts] == [("tool_use", "get_weather")]
    partial = "".join(
        e.delta.partial_json
        for e in raw
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    )
    assert json.loads(partial) == {"city": "Paris"}
    (delta,) = [e for e in raw if e.type == "message_delta"]
    assert delta.delta.stop_reason == "tool_use"
    steps = read_steps(gateway.bootstrap, {sid})
    assert len(steps) == 2
    said = "".join(b.text for b in text.content if b.type == "text")
    assert decoded(tokenizer, steps[0]) == said
    assert text.usage.output_tokens == len(steps[0].response_token_ids)
    assert decoded(tokenizer, steps[1]) == TOOL_ANSWER


# --- errors ---------------------------------------------------------------------------------

USER = [{"role": "user", "content": "x"}]
COMMON_BAD = [(b"{not json", 400), (b"[1, 2]", 400), (b"{}", 400)]
RESPONSES_BAD = [
    *COMMON_BAD,
    ({"model": "m", "input": 5}, 400),
    ({"model": "m", "input": [{"type": "web_search_call"}]}, 400),
    ({"model": "m", "input": [{"role": "robot", "content": "x"}]}, 400),
    ({"model": "m", "input": [{"type": "function_call_output"}]}, 400),
    ({"model": "m", "input": "x", "tools": [{"type": "function"}]}, 400),  # no name
    ({"model": "m", "input": "x", "tools": [{"type": "namespace", "tools": []}]}, 400),
    ({"model": "m", "input": "x", "tools": [RESPONSES_TOOL], "tool_choice": 3}, 400),
    ({"model": "m", "input": "x", "previous_response_id": "resp_nope"}, 404),
    ({"model": "m", "input": "x", "max_output_tokens": 10**9}, 400),  # the engine's refusal
    ({"model": "m", "input": "x", "temperature": "hot"}, 400),
]
MESSAGES_BAD = [
    *COMMON_BAD,
    ({"model": "m", "messages": "hi", "max_tokens": 2}, 400),
    ({"model": "m", "messages": USER}, 400),  # max_tokens is required
    # a system message inside `messages` is taken, as the real API takes Claude Code's
    ({"model": "m", "max_tokens": 2, "messages": [{"role": "tool", "content": "x"}]}, 400),
    (
        {
            "model": "m",
            "max_tokens": 2,
            "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "1"}]}],
        },
        400,
    ),
    (
        {
            "model": "m",
            "max_tokens": 2,
            "messages": [{"role": "user", "content": [{"type": "tool_result"}]}],
        },
        400,
    ),
    (
        {
            "model": "m",
            "max_tokens": 2,
            "messages": USER,
            "tools": [{"description": "a custom tool with no name", "input_schema": {}}],
        },
        400,
    ),
    (
        {
            "model": "m",
            "max_tokens": 2,
            "messages": USER,
            "tools": [ANTHROPIC_TOOL],
            "tool_choice": {"type": "sometimes"},
        },
        400,
    ),
    ({"model": "m", "max_tokens": 10**9, "messages": USER}, 400),  # the engine's refusal
    ({"model": "m", "max_tokens": 2, "messages": USER, "temperature": 7}, 400),
]


def post(url: str, body: bytes | dict) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        url, content=content, headers={"content-type": "application/json"}, timeout=60
    )


@pytest.mark.parametrize("prefix", ["", "/v1", "/s-err/g", "/s-err/g/v1"])
def test_bad_input_gets_each_apis_own_error_shape(gateway: GatewayProcess, prefix: str) -> None:
    for body, status in RESPONSES_BAD:
        r = post(f"{gateway.base_url}{prefix}/responses", body)
        assert r.status_code == status, (body, r.text)
        error = r.json()["error"]
        assert error["message"] and error["code"] == status and error["type"], r.text
    for body, status in MESSAGES_BAD:
        r = post(f"{gateway.base_url}{prefix}/messages", body)
        assert r.status_code == status, (body, r.text)
        answer = r.json()
        assert answer["type"] == "error" and answer["error"]["message"], r.text
        assert answer["error"]["type"] == "invalid_request_error", r.text
