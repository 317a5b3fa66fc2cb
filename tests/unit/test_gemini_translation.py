"""The Gemini door's translation, pure logic: Gemini CLI's recorded requests
(tests/fixtures/agents/gemini/) as chat bodies, function calls and their responses paired with or
without ids, Gemini's Schema as JSON Schema, thinking settings, the stream in both framings,
Google's error shape, and Gemini CLI's calls recognised (tests/component/test_gemini_door.py
serves them; tests/e2e/test_gemini_cli.py runs the agent)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from claw_stream.agents.recognition import agent_call
from claw_stream.dialect import ContextTooLong, OpenAIError, gemini_error_of
from claw_stream.gateway.gemini.format import (
    GeminiStream,
    chat_body,
    chat_messages,
    json_schema,
    parts_of,
    reasoning_settings,
    usage_metadata,
)
from claw_stream.gateway.gemini.protocol import GenerateContentRequest, ThinkingConfig
from claw_stream.gateway.protocol import DOOR_FIELD

from ..support.paths import AGENTS


def recorded() -> list[dict[str, Any]]:
    lines = (AGENTS / "gemini" / "requests.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def lower(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}  # as ASGI hands them over


def request(body: dict[str, Any]) -> GenerateContentRequest:
    return GenerateContentRequest.model_validate(body)


def test_gemini_clis_requests_become_chat_in_their_order() -> None:
    first, resumed, tool_round = recorded()
    chat = chat_body(request(first["body"]), first["body"], "policy", stream=True)
    assert [m["role"] for m in chat["messages"]] == ["system", "user"]
    assert chat["messages"][0]["content"].startswith("You are Gemini CLI")
    # its session context and the prompt, two parts of one user turn, one message
    assert chat["messages"][1]["content"].startswith("<session_context>")
    assert chat["messages"][1]["content"].endswith("\nReply with one short sentence about the sea.")
    declarations = first["body"]["tools"][0]["functionDeclarations"]
    assert [t["function"]["name"] for t in chat["tools"]] == [d["name"] for d in declarations]
    assert chat["tools"][1]["function"]["parameters"] == declarations[1]["parametersJsonSchema"]
    assert (chat["temperature"], chat["top_p"], chat["top_k"]) == (1, 0.95, 64)
    assert chat["stream_options"] == {"include_usage": True} and chat["model"] == "policy"
    assert "chat_template_kwargs" not in chat  # includeThoughts alone changes no prompt
    assert chat[DOOR_FIELD] == {"api": "gemini"}
    roles = [m["role"] for m in chat_messages(request(resumed["body"]))]
    assert roles == ["system", "user", "assistant", "user"]
    messages = chat_messages(request(tool_round["body"]))
    assert messages[2]["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "list_directory", "arguments": '{"dir_path": "."}'},
        }
    ]
    # its `{"output": text}` result as the text a chat client sends
    assert messages[3]["role"] == "tool" and messages[3]["tool_call_id"] == "call_1"
    assert messages[3]["content"].startswith("Directory listing for /home/user/project:")


def test_calls_without_ids_get_them_from_their_place_and_responses_pair_by_name() -> None:
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "weather in Paris and Rome, and the time?"}]},
            {
                "role": "model",
                "parts": [
                    {"text": "Looking.", "thought": True},
                    {"functionCall": {"name": "weather", "args": {"city": "Paris"}}},
                    {"functionCall": {"name": "weather", "args": {"city": "Rome"}}},
                    {"function_call": {"name": "clock"}},  # snake_case, as protobuf takes too
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "clock", "response": {"time": "noon"}}},
                    {"functionResponse": {"name": "weather", "response": {"output": "sun"}}},
                    {"functionResponse": {"name": "weather", "response": {"error": "no data"}}},
                    {"text": "thanks"},
                ],
            },
        ]
    }
    messages = chat_messages(request(body))
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "tool", "user"]
    ids = [c["id"] for c in messages[1]["tool_calls"]]
    assert ids == ["call_1_1", "call_1_2", "call_1_3"]
    assert messages[1]["reasoning_content"] == "Looking." and messages[1]["content"] is None
    assert [(m["tool_call_id"], m["content"]) for m in messages[2:5]] == [
        ("call_1_3", '{"time": "noon"}'),
        ("call_1_1", "sun"),
        ("call_1_2", "Error: no data"),
    ]
    # the same conversation renders the same prompt each time it is sent
    assert chat_messages(request(body)) == messages


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"contents": [{"role": "user", "parts": [{"functionCall": {"name": "f"}}]}]}, "user turn"),
        ({"contents": [{"role": "model", "parts": [{"functionResponse": {}}]}]}, "model turn"),
        ({"contents": [{"role": "model", "parts": [{"functionCall": {"args": {}}}]}]}, "name"),
        (
            {
                "contents": [
                    {"role": "model", "parts": [{"functionCall": {"name": "f", "args": 5}}]}
                ]
            },
            "args must be an object",
        ),
        (
            {"contents": [{"parts": [{"functionResponse": {"name": "f", "response": "sunny"}}]}]},
            "response must be an object",
        ),
    ],
)
def test_what_cannot_be_read_is_named(body: dict[str, Any], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        chat_messages(request(body))


def test_geminis_schema_becomes_json_schema() -> None:
    schema = {
        "type": "OBJECT",
        "properties": {
            "tags": {"type": "ARRAY", "items": {"type": "STRING"}},
            "when": {"anyOf": [{"type": "INTEGER"}, {"type": "NULL"}]},
        },
        "required": ["tags"],
    }
    assert json_schema(schema) == {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string"}},
            "when": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        },
        "required": ["tags"],
    }
    chat = chat_body(
        request(
            {
                "contents": [{"parts": [{"text": "x"}]}],
                "tools": [
                    {"functionDeclarations": [{"name": "f", "parameters": schema}]},
                    {"googleSearch": {}},
                    {"codeExecution": {}},
                ],
                "toolConfig": {
                    "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f"]}
                },
                "generationConfig": {
                    "responseMimeType": "application/json",
                    "responseSchema": schema,
                    "maxOutputTokens": 9,
                    "stopSequences": ["\n\n"],
                },
                "safetySettings": [{"category": "HARM_CATEGORY_HATE_SPEECH"}],
            }
        ),
        {"safetySettings": [{}]},
        "m",
        stream=False,
    )
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": json_schema(schema)}}
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert chat["response_format"]["json_schema"]["schema"] == json_schema(schema)
    assert (chat["max_tokens"], chat["stop"]) == (9, ["\n\n"])
    # Google's own tools and settings are left out, and the Step says so
    assert chat[DOOR_FIELD] == {
        "api": "gemini",
        "not_honoured": ["safetySettings"],
        "left_out_tools": ["googleSearch", "codeExecution"],
    }


@pytest.mark.parametrize(
    ("thinking", "settings"),
    [
        ({"includeThoughts": True}, {}),
        ({"thinkingBudget": 0}, {"chat_template_kwargs": {"enable_thinking": False}}),
        ({"thinkingBudget": -1}, {"chat_template_kwargs": {"enable_thinking": True}}),
        ({"thinkingBudget": 8192}, {"chat_template_kwargs": {"enable_thinking": True}}),
        ({"thinkingLevel": "MINIMAL"}, {"chat_template_kwargs": {"enable_thinking": False}}),
        (
            {"thinkingLevel": "high"},
            {"chat_template_kwargs": {"enable_thinking": True}, "reasoning_effort": "high"},
        ),
    ],
)
def test_thinking_config_maps_to_the_template_switch(
    thinking: dict[str, Any], settings: dict[str, Any]
) -> None:
    assert reasoning_settings(ThinkingConfig.model_validate(thinking)) == settings


def test_an_answer_becomes_parts_and_usage_metadata() -> None:
    message = {
        "content": "Sunny.",
        "reasoning_content": "Check first.",
        "tool_calls": [{"id": "c1", "function": {"name": "w", "arguments": '{"city": "Paris"}'}}],
    }
    assert parts_of(message, thoughts=True) == [
        {"text": "Check first.", "thought": True},
        {"text": "Sunny."},
        {"functionCall": {"id": "c1", "name": "w", "args": {"city": "Paris"}}},
    ]
    assert parts_of(message, thoughts=False)[0] == {"text": "Sunny."}
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 7,
        "completion_tokens_details": {"reasoning_tokens": 3},
        "prompt_tokens_details": {"cached_tokens": 8},
    }
    assert usage_metadata(usage) == {
        "promptTokenCount": 10,
        "candidatesTokenCount": 4,
        "totalTokenCount": 17,
        "thoughtsTokenCount": 3,
        "cachedContentTokenCount": 8,
    }


CHUNKS = [
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
                "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '": 1}'}}]},
                "finish_reason": "tool_calls",
            }
        ]
    },
    {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7}},
]


def test_the_stream_sends_text_as_it_comes_and_a_call_whole_at_the_end() -> None:
    stream = GeminiStream("r1", "m", thoughts=False, sse=True)
    blob = b"".join(stream.feed(c) for c in CHUNKS) + stream.end()
    assert blob.endswith(b"\r\n\r\n")
    chunks = [orjson.loads(e[6:]) for e in blob.split(b"\r\n\r\n") if e]
    assert [c["candidates"][0]["content"]["parts"] for c in chunks] == [
        [{"text": "Let me look."}],
        [{"functionCall": {"id": "call_1", "name": "w", "args": {"c": 1}}}],
    ]
    assert "finishReason" not in chunks[0]["candidates"][0]
    assert chunks[1]["candidates"][0]["finishReason"] == "STOP"
    assert chunks[1]["usageMetadata"]["candidatesTokenCount"] == 7
    assert {c["responseId"] for c in chunks} == {"r1"}
    # without alt=sse: one JSON array
    array = GeminiStream("r1", "m", thoughts=False, sse=False)
    whole = b"".join(array.feed(c) for c in CHUNKS) + array.end()
    assert [c["candidates"][0]["content"]["parts"] for c in orjson.loads(whole)] == [
        [{"text": "Let me look."}],
        [{"functionCall": {"id": "call_1", "name": "w", "args": {"c": 1}}}],
    ]
    broken = GeminiStream("r1", "m", thoughts=False, sse=False)
    cut = broken.feed(CHUNKS[0]) + broken.error(500, "broke off", "INTERNAL")
    assert orjson.loads(cut)[-1] == {
        "error": {"code": 500, "message": "broke off", "status": "INTERNAL"}
    }


def test_googles_error_shape() -> None:
    assert gemini_error_of(OpenAIError(404, "does not exist", param="model")) == {
        "error": {"code": 404, "message": "model: does not exist", "status": "NOT_FOUND"}
    }
    assert gemini_error_of(OpenAIError(429, "slow down"))["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert gemini_error_of(OpenAIError(503, "busy"))["error"]["status"] == "UNAVAILABLE"
    overflow = ContextTooLong("vLLM's words", 9000, 8192, "messages")
    assert gemini_error_of(overflow) == {
        "error": {
            "code": 400,
            "message": "The input token count (9000) exceeds the maximum number of tokens "
            "allowed (8192).",
            "status": "INVALID_ARGUMENT",
        }
    }


def test_gemini_clis_calls_are_recognised_and_those_without_tools_are_side_calls() -> None:
    record = recorded()[0]
    headers, body = lower(record["headers"]), record["body"]
    main = agent_call(headers, body)
    assert (main.agent, main.session_id, main.side) == ("gemini", None, False)
    utility = agent_call(headers, {k: v for k, v in body.items() if k != "tools"})
    assert (utility.agent, utility.side) == ("gemini", True)
    assert agent_call({"user-agent": "google-genai-sdk/1.30.0"}, body).agent == ""
