"""The Gemini API door (`/v1beta/models/{model}:generateContent`, `:streamGenerateContent`,
`:countTokens`) against a real gateway, engine, broker and Postgres: Gemini CLI's recorded
requests (tests/fixtures/agents/gemini/) each one Step whose prompt ids are the engine's own
rendering of what was sent; a function declaration's call and its response through the door;
the stream as server-sent events and as a JSON array; the key as `x-goog-api-key` or `?key=`;
bad input, and a prompt too long, in Google's error shape."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from ..support.engine import ADMIN_KEY, TOOL_ANSWER, TOOL_PROMPT, WEATHER_TOOL, EngineProcess
from ..support.gateway import GatewayProcess, check_exact_tokens, read_steps
from ..support.paths import AGENTS

QUESTION = TOOL_PROMPT[0]["content"]
FN = WEATHER_TOOL["function"]
# the weather tool as a Gemini `Schema` (OpenAPI's subset, types in capitals)
DECLARATION = {
    "name": FN["name"],
    "description": FN["description"],
    "parameters": {
        "type": "OBJECT",
        "properties": {"city": {"type": "STRING"}},
        "required": ["city"],
    },
}
GENERATE = "/v1beta/models/{model}:generateContent"
STREAM = "/v1beta/models/{model}:streamGenerateContent"


def recorded() -> list[dict[str, Any]]:
    lines = (AGENTS / "gemini" / "requests.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def sse(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def text_of(response: dict[str, Any]) -> str:
    parts = response["candidates"][0]["content"]["parts"]
    return "".join(p.get("text", "") for p in parts if not p.get("thought"))


def streamed_text(chunks: list[dict[str, Any]]) -> str:
    return "".join(text_of(chunk) for chunk in chunks)


def decoded(tokenizer: Any, step: Any) -> str:
    return tokenizer.decode(step.response_token_ids, skip_special_tokens=True)


def post(url: str, body: dict[str, Any] | bytes, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        url, content=content, headers={"content-type": "application/json", **headers}, timeout=120
    )


@pytest.fixture(scope="module")
def tools_tokenizer(tiny_models: dict[str, Path]) -> Any:
    return AutoTokenizer.from_pretrained(tiny_models["tools"])


@pytest.fixture(scope="module")
def long_tokenizer(long_model: Path) -> Any:
    return AutoTokenizer.from_pretrained(long_model)


# --- Gemini CLI's own requests ----------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_each_recorded_gemini_cli_request_is_one_step_with_exact_tokens(
    long_gateway: GatewayProcess,
    long_engine: EngineProcess,
    long_tokenizer: Any,
    stream: bool,
) -> None:
    """Each record as Gemini CLI sent it, under a base URL naming the session (it names none
    itself): streamed as recorded, or whole at `:generateContent`."""
    session = f"gem-{uuid.uuid4().hex[:8]}"
    answers = []
    for record in recorded():
        headers = {k: v for k, v in record["headers"].items() if k.lower() != "accept-encoding"}
        path = record["path"] if stream else GENERATE.format(model="policy")
        r = post(f"{long_gateway.base_url}/{session}{path}", record["body"], **headers)
        assert r.status_code == 200, r.text
        if stream:
            assert r.headers["content-type"].startswith("text/event-stream")
            chunks = sse(r.text)
            last = chunks[-1]
            assert last["candidates"][0]["finishReason"] in ("STOP", "MAX_TOKENS")
            answers.append((streamed_text(chunks), last["usageMetadata"]))
        else:
            answer = r.json()
            answers.append((text_of(answer), answer["usageMetadata"]))
    steps = read_steps(long_gateway.bootstrap, {session})
    assert len(steps) == len(answers) == 3
    for step, (text, usage) in zip(steps, answers, strict=True):
        # Gemini CLI's main turns carry its tools: main, trained
        assert step.turn_type == "main" and step.train, step.request.extra
        assert len(step.request.tools or ()) == 8
        assert step.request.extra["claw_door"] == {"api": "gemini"}
        check_exact_tokens(long_engine, step, long_tokenizer, text)
        assert usage["promptTokenCount"] == len(step.prompt_token_ids)
        assert usage["candidatesTokenCount"] == len(step.response_token_ids)
    # the resumed conversation: its history and the new prompt, as chat messages
    roles = [m.role for m in steps[1].request.messages]
    assert roles == ["system", "user", "assistant", "user"]
    assert (
        steps[1]
        .request.messages[1]
        .content.endswith("</session_context>\nReply with one short sentence about the sea.")
    )
    # the tool round trip: its call (with the id it was given) and the result's text
    messages = steps[2].request.messages
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool"]
    (call,) = messages[2].tool_calls
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == (
        "call_1",
        "list_directory",
        {"dir_path": "."},
    )
    assert messages[3].tool_call_id == "call_1"
    assert messages[3].content.startswith("Directory listing for /home/user/project:")


def test_a_gemini_cli_call_without_tools_is_a_side_call(
    long_gateway: GatewayProcess, long_tokenizer: Any
) -> None:
    """Gemini CLI's utility calls (its `BaseLlmClient`: compression, loop detection, the
    next-speaker check) go to `:generateContent` with no tools and a JSON schema for the
    answer: side calls, whatever session they land in. Built from its recorded headers and
    history, as its next-speaker check sends them."""
    record = recorded()[1]
    session = f"gem-{uuid.uuid4().hex[:8]}"
    check = "Analyze *only* the content of your last response: who should speak next?"
    body = {
        "contents": [*record["body"]["contents"], {"role": "user", "parts": [{"text": check}]}],
        "generationConfig": {
            "temperature": 0,
            "responseMimeType": "application/json",
            "responseJsonSchema": {
                "type": "object",
                "properties": {"next_speaker": {"type": "string", "enum": ["user", "model"]}},
            },
        },
    }
    headers = {k: v for k, v in record["headers"].items() if k.lower() != "accept-encoding"}
    r = post(
        f"{long_gateway.base_url}/{session}" + GENERATE.format(model="policy"), body, **headers
    )
    assert r.status_code == 200, r.text
    (step,) = read_steps(long_gateway.bootstrap, {session})
    assert step.turn_type == "side" and not step.request.tools
    assert decoded(long_tokenizer, step) == text_of(r.json())
    # the JSON it asked for is passed on (vLLM honours it; the built-in engine does not)
    assert step.request.extra["response_format"]["type"] == "json_schema"


# --- the door, with the tiny tool-calling model -----------------------------------------------


def test_a_function_call_and_its_response_with_a_system_instruction(
    gateway: GatewayProcess, tools_tokenizer: Any
) -> None:
    """The key as `?key=` (a session key: the Steps land in its session); a declaration in
    Gemini's Schema becomes the tool the model knows; its call comes back as a functionCall
    part, and the functionResponse goes back in as the tool's result."""
    started = httpx.post(
        gateway.base_url + "/rl/start_session",
        json={},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    ).json()
    url = gateway.base_url + GENERATE.format(model="gemini-2.5-pro") + f"?key={started['api_key']}"
    question = {"role": "user", "parts": [{"text": QUESTION}]}
    tools = [{"functionDeclarations": [DECLARATION]}]
    first = post(
        url,
        {"contents": [question], "tools": tools, "generationConfig": {"temperature": 0}},
    )
    assert first.status_code == 200, first.text
    answer = first.json()
    (candidate,) = answer["candidates"]
    assert candidate["finishReason"] == "STOP" and answer["modelVersion"] == "gemini-2.5-pro"
    (part,) = candidate["content"]["parts"]
    call = part["functionCall"]
    assert (call["name"], call["args"]) == ("get_weather", {"city": "Paris"}) and call["id"]
    reply = {
        "role": "user",
        "parts": [
            {
                "functionResponse": {
                    "id": call["id"],
                    "name": "get_weather",
                    "response": {"output": "sunny"},
                }
            }
        ],
    }
    then = {
        "systemInstruction": {"parts": [{"text": "You are terse."}]},
        "contents": [question, candidate["content"], reply],
        "tools": tools,
        "generationConfig": {"maxOutputTokens": 6},
    }
    second = post(url, then)
    assert second.status_code == 200, second.text
    steps = read_steps(gateway.bootstrap, {started["session_id"]})
    assert [s.step_id.hex for s in steps] == [answer["responseId"], second.json()["responseId"]]
    assert decoded(tools_tokenizer, steps[0]) == TOOL_ANSWER
    assert steps[0].request.tools == [WEATHER_TOOL]  # the declaration, as chat clients send it
    messages = steps[1].request.messages
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[0].content == "You are terse." and messages[3].content == "sunny"
    assert messages[2].tool_calls[0].id == call["id"] == messages[3].tool_call_id
    assert decoded(tools_tokenizer, steps[1]) == text_of(second.json())
    usage = second.json()["usageMetadata"]
    assert usage["promptTokenCount"] == len(steps[1].prompt_token_ids)
    assert usage["candidatesTokenCount"] == len(steps[1].response_token_ids)
    assert usage["totalTokenCount"] == usage["promptTokenCount"] + usage["candidatesTokenCount"]
    # countTokens: the same prompt's tokens, no Step
    counted = post(
        gateway.base_url + "/v1beta/models/any:countTokens",
        {"generateContentRequest": then},
        **{"x-goog-api-key": started["api_key"]},
    )
    assert counted.status_code == 200, counted.text
    assert counted.json() == {"totalTokens": len(steps[1].prompt_token_ids)}
    assert len(read_steps(gateway.bootstrap, {started["session_id"]})) == 2


def test_the_stream_as_server_sent_events_and_as_a_json_array(
    gateway: GatewayProcess, tools_tokenizer: Any
) -> None:
    session = f"gem-{uuid.uuid4().hex[:8]}"
    base = f"{gateway.base_url}/{session}/grp" + STREAM.format(model="m")
    hello = {"contents": [{"parts": [{"text": "Hi"}]}], "generationConfig": {"maxOutputTokens": 8}}
    events = post(base + "?alt=sse", hello, **{"x-goog-api-key": "any-key"})
    assert events.status_code == 200 and events.headers["content-type"].startswith(
        "text/event-stream"
    )
    chunks = sse(events.text)
    assert all(c["responseId"] == chunks[0]["responseId"] for c in chunks)
    assert "finishReason" in chunks[-1]["candidates"][0] and "usageMetadata" in chunks[-1]
    assert not any("finishReason" in c["candidates"][0] for c in chunks[:-1])
    # without alt=sse: one JSON array, written as it grows
    called = post(
        base,
        {
            "contents": [{"role": "user", "parts": [{"text": QUESTION}]}],
            "tools": [{"functionDeclarations": [DECLARATION]}],
            "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}},
            "generationConfig": {"temperature": 0},
        },
    )
    assert called.status_code == 200, called.text
    array = called.json()
    assert isinstance(array, list)
    calls = [
        p["functionCall"]
        for c in array
        for p in c["candidates"][0]["content"]["parts"]
        if "functionCall" in p
    ]
    assert [(c["name"], c["args"]) for c in calls] == [("get_weather", {"city": "Paris"})]
    steps = read_steps(gateway.bootstrap, {session})
    assert [s.group_id for s in steps] == ["grp", "grp"]
    assert decoded(tools_tokenizer, steps[0]) == streamed_text(chunks)
    assert chunks[-1]["usageMetadata"]["candidatesTokenCount"] == len(steps[0].response_token_ids)
    assert decoded(tools_tokenizer, steps[1]) == TOOL_ANSWER
    assert steps[1].request.tool_choice == "auto"


# --- errors -----------------------------------------------------------------------------------

USER = [{"role": "user", "parts": [{"text": "x"}]}]
BAD = [
    (b"{not json", 400),
    (b"[1, 2]", 400),
    (b"{}", 400),  # contents are required
    ({"contents": []}, 400),
    ({"contents": [{"role": "robot", "parts": [{"text": "x"}]}]}, 400),
    ({"contents": [{"role": "user", "parts": [{"functionCall": {"name": "f"}}]}]}, 400),
    ({"contents": [{"role": "model", "parts": [{"functionResponse": {"name": "f"}}]}]}, 400),
    ({"contents": USER, "tools": [{"functionDeclarations": [{"description": "no name"}]}]}, 400),
    ({"contents": USER, "toolConfig": {"functionCallingConfig": {"mode": "SOMETIMES"}}}, 400),
    ({"contents": USER, "generationConfig": {"temperature": "hot"}}, 400),
    ({"contents": USER, "generationConfig": {"candidateCount": 2}}, 400),
    ({"contents": USER, "generationConfig": {"maxOutputTokens": 10**9}}, 400),
    ({"contents": USER, "generationConfig": {"thinkingConfig": {"thinkingLevel": "MAX"}}}, 400),
]


@pytest.mark.parametrize("prefix", ["", "/s-gem-err", "/s-gem-err/g"])
def test_bad_input_gets_geminis_error_shape(gateway: GatewayProcess, prefix: str) -> None:
    for path in (GENERATE, STREAM + "?alt=sse"):
        url = gateway.base_url + prefix + path.format(model="m")
        for body, status in BAD:
            r = post(url, body)
            assert r.status_code == status, (body, r.text)
            error = r.json()["error"]
            assert error["code"] == status and error["status"] == "INVALID_ARGUMENT", r.text
            assert error["message"], r.text
    # a key the gateway does not know, by either of Google's ways of sending it
    refused = post(
        gateway.base_url + GENERATE.format(model="m") + "?key=claw-sk-nope", {"contents": USER}
    )
    assert refused.status_code == 401
    assert refused.json()["error"]["status"] == "UNAUTHENTICATED", refused.text
    refused = post(
        gateway.base_url + GENERATE.format(model="m"),
        {"contents": USER},
        **{"x-goog-api-key": "claw-sk-nope"},
    )
    assert refused.status_code == 401 and refused.json()["error"]["code"] == 401


def test_a_prompt_too_long_gets_the_gemini_apis_words(gateway: GatewayProcess) -> None:
    """Gemini CLI's first request on the 512-token model: the real API's message, in its
    shape, stream or not (before the stream begins)."""
    record = recorded()[0]
    for path in (record["path"], GENERATE.format(model="policy")):
        r = post(gateway.base_url + path, record["body"], **{"x-goog-api-key": "any-key"})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["status"] == "INVALID_ARGUMENT" and error["code"] == 400
        assert error["message"].startswith("The input token count (")
        assert error["message"].endswith(") exceeds the maximum number of tokens allowed (512).")
