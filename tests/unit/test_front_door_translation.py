"""The Responses and Messages translations to and from chat completions, and model names:
pure logic (the integration tests run them against the real engine)."""

from __future__ import annotations

import orjson
import pytest

from claw_stream.dialect import OpenAIError, anthropic_error_body
from claw_stream.gateway.messages.format import MessagesStream, chat_messages
from claw_stream.gateway.messages.protocol import MessagesRequest
from claw_stream.gateway.model_names import ModelNames
from claw_stream.gateway.responses.format import ResponsesStream, ToolMap, input_messages
from claw_stream.gateway.responses.protocol import ResponsesRequest
from claw_stream.gateway.responses.store import ResponseStore
from claw_stream.gateway.upstreams import Backend


def events(blob: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in blob.split(b"\n\n"):
        if block:
            name, data = block.split(b"\n")
            out.append((name[7:].decode(), orjson.loads(data[6:])))
    return out


CALL_CHUNKS = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me look."}}]},
    {
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {"index": 0, "id": "call_1", "function": {"name": "w", "arguments": ""}}
                    ]
                },
            }
        ]
    },
    {
        "choices": [
            {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"c'}}]}}
        ]
    },
    {
        "choices": [
            {
                "index": 0,
                "delta": {"tool_calls": [{"index": 0, "function": {"arguments": 'ity": 1}'}}]},
            }
        ]
    },
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}},
]


def test_messages_become_chat_messages_with_tool_results_first() -> None:
    req = MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 5,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "P"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "sun"}],
                        },
                        {"type": "text", "text": "thanks"},
                    ],
                },
            ],
        }
    )
    assert chat_messages(req) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "w", "arguments": '{"city": "P"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "sun"},
        {"role": "user", "content": "thanks"},
    ]


def test_messages_stream_follows_anthropics_event_order() -> None:
    req = MessagesRequest.model_validate(
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    )
    stream = MessagesStream(req, "msg_1")
    blob = stream.start() + b"".join(stream.feed(c) for c in CALL_CHUNKS) + stream.end()
    kinds = [(name, body.get("index")) for name, body in events(blob)]
    assert kinds == [
        ("message_start", None),
        ("ping", None),
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("message_delta", None),
        ("message_stop", None),
    ]
    parsed = events(blob)
    assert parsed[5][1]["content_block"] == {
        "type": "tool_use",
        "id": "call_1",
        "name": "w",
        "input": {},
    }
    assert parsed[9][1]["delta"]["stop_reason"] == "tool_use"
    assert parsed[9][1]["usage"]["output_tokens"] == 7


def test_responses_input_items_and_stream() -> None:
    assert input_messages(
        [
            {"role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
            {"type": "message", "role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sun"},
        ]
    ) == [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sun"},
    ]
    req = ResponsesRequest.model_validate({"model": "m", "input": "x", "stream": True})
    stream = ResponsesStream(req, "resp_1", "1", ToolMap(None))
    blob = stream.start() + b"".join(stream.feed(c) for c in CALL_CHUNKS) + stream.finish()
    parsed = events(blob)
    assert [b["sequence_number"] for _, b in parsed] == list(range(len(parsed)))
    assert [n for n, _ in parsed][-1] == "response.completed"
    final = parsed[-1][1]["response"]
    assert [i["type"] for i in final["output"]] == ["message", "function_call"]
    assert final["output"][1]["arguments"] == '{"city": 1}'
    assert final["usage"]["output_tokens"] == 7
    assert stream.assistant_message()["tool_calls"][0]["id"] == "call_1"


def test_response_store_keeps_the_newest() -> None:
    store = ResponseStore(2)
    for i in range(3):
        store.put(f"r{i}", [{"role": "user", "content": str(i)}])
    assert store.get("r0") is None and len(store) == 2
    kept = store.get("r1")
    assert kept == [{"role": "user", "content": "1"}]
    kept.append({"role": "assistant"})  # a copy: the stored chain is not changed
    assert store.get("r1") == [{"role": "user", "content": "1"}]
    store.put("r3", [], owner="digest-of-a-key")
    assert store.owner("r3") == "digest-of-a-key" and store.owner("r1") is None
    assert store.owner("r0") is None  # gone


class Pool:
    def __init__(self, *models: str):
        self.backends = [Backend("http://e", models=models)]


def test_model_names() -> None:
    names = ModelNames(Pool("policy", "policy@v2"), {"default": "policy@v2"}, strict=False)  # type: ignore[arg-type]
    assert names.resolve("default") == "policy@v2"
    assert names.resolve("your-model-name") == "policy"
    assert names.resolve("policy@v2") == "policy@v2"
    assert names.resolve("policy@v9") == "policy@v9"  # the engine's 404, never the newest
    strict = ModelNames(Pool("policy"), {}, strict=True)  # type: ignore[arg-type]
    with pytest.raises(OpenAIError) as refused:
        strict.resolve("gpt-4o")
    assert refused.value.status == 404


def test_anthropic_error_shape() -> None:
    assert anthropic_error_body(404, "does not exist", "model") == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "model: does not exist"},
    }
    assert anthropic_error_body(503, "busy")["error"]["type"] == "overloaded_error"
