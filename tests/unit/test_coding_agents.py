"""Claude Code's and Codex's own requests (tests/fixtures/agents/, recorded from the real
agents) through the Messages and Responses translations, and the sessions and side requests
their headers name: pure logic (tests/e2e/test_coding_agents.py runs the agents)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from claw_stream.agents.recognition import NO_AGENT, AgentCall, agent_call
from claw_stream.gateway.messages.format import MessagesStream, content_blocks
from claw_stream.gateway.messages.format import chat_body as messages_chat_body
from claw_stream.gateway.messages.protocol import MessagesRequest
from claw_stream.gateway.protocol import DOOR_FIELD
from claw_stream.gateway.responses.format import (
    ResponsesStream,
    ToolMap,
    input_messages,
    output_items,
)
from claw_stream.gateway.responses.format import chat_body as responses_chat_body
from claw_stream.gateway.responses.protocol import ResponsesRequest

from ..support.paths import AGENTS


def recorded(agent: str) -> list[dict[str, Any]]:
    lines = (AGENTS / agent / "requests.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def lower(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}  # as ASGI hands them over


def events(blob: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(block.split(b"\ndata: ")[1]) for block in blob.split(b"\n\n") if block]


# --- Claude Code ---------------------------------------------------------------------------


@pytest.mark.parametrize("record", recorded("claude-code"), ids=lambda r: f"request-{r['index']}")
def test_claude_codes_request_becomes_a_chat_in_its_order(record: dict[str, Any]) -> None:
    body = record["body"]
    chat = messages_chat_body(MessagesRequest.model_validate(body), body)
    roles = [m["role"] for m in chat["messages"]]
    # its system blocks first, then its messages in order: the environment it sends as a
    # system message after the first user message stays there
    assert roles == ["system", "user", "system"]
    assert chat["messages"][0]["content"].startswith("x-anthropic-billing-header")
    assert chat["messages"][2]["content"].startswith("# Environment")
    assert "Reply with one short sentence about the sea." in chat["messages"][1]["content"]
    assert [t["function"]["name"] for t in chat["tools"]] == [t["name"] for t in body["tools"]]
    assert chat["tools"][1]["function"]["parameters"] == body["tools"][1]["input_schema"]
    # thinking adaptive and effort high, as the engine's (vLLM's) reasoning settings
    assert chat["chat_template_kwargs"] == {"enable_thinking": True}
    assert chat["reasoning_effort"] == "high"
    assert chat["max_tokens"] == 32000 and chat["stream"] is body["stream"]
    assert chat[DOOR_FIELD] == {
        "api": "messages",
        "not_honoured": ["context_management", "metadata"],
    }


@pytest.mark.parametrize(
    ("thinking", "enabled"),
    [({"type": "enabled", "budget_tokens": 2048}, True), ({"type": "disabled"}, False)],
)
def test_every_kind_of_thinking_maps_to_the_template_switch(
    thinking: dict[str, Any], enabled: bool
) -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    chat = messages_chat_body(MessagesRequest.model_validate(body | {"thinking": thinking}), body)
    assert chat["chat_template_kwargs"] == {"enable_thinking": enabled}
    with pytest.raises(ValueError, match=r"thinking\.type"):
        messages_chat_body(
            MessagesRequest.model_validate(body | {"thinking": {"type": "sometimes"}}), body
        )


def test_anthropics_server_tools_are_left_out_and_noted() -> None:
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "x"}],
        "tools": [
            {"name": "Read", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search"},
        ],
    }
    chat = messages_chat_body(MessagesRequest.model_validate(body), body)
    assert [t["function"]["name"] for t in chat["tools"]] == ["Read"]
    assert chat[DOOR_FIELD]["left_out_tools"] == ["web_search"]


def test_claude_code_names_its_session() -> None:
    for record in recorded("claude-code"):
        call = agent_call(lower(record["headers"]), record["body"])
        assert call == AgentCall("claude-code", "claude-code-9a82edd3-3da8-4bfa-9b94-eb1d9b04833c")
    # without the header: metadata.user_id, as JSON, or in its older form
    body = recorded("claude-code")[0]["body"]
    assert agent_call({}, body).session_id == "claude-code-9a82edd3-3da8-4bfa-9b94-eb1d9b04833c"
    old = {
        "metadata": {"user_id": "user_ab12_account_c3d4_session_5e6f7a8b-0000-1111"},
        "tools": body["tools"],
    }
    assert agent_call({}, old).session_id == "claude-code-5e6f7a8b-0000-1111"
    assert agent_call({}, {"metadata": {"user_id": "someone"}}) == NO_AGENT
    # its side queries (a title, a summary, a quota probe) carry no tools
    title = {"X-Claude-Code-Session-Id": "s"}
    assert agent_call(lower(title), {"tools": []}) == AgentCall(
        "claude-code", "claude-code-s", True
    )


# --- Codex ---------------------------------------------------------------------------------


def codex_body() -> dict[str, Any]:
    return recorded("codex")[0]["body"]


def test_codexs_namespace_tool_is_flattened_and_web_search_left_out() -> None:
    body = codex_body()
    tools = ToolMap(body["tools"])
    names = [t["function"]["name"] for t in tools.tools]
    namespace = next(t for t in body["tools"] if t["type"] == "namespace")
    inner = [t["name"] for t in namespace["tools"]]
    assert [f"multi_agent_v1__{n}" for n in inner] == [n for n in names if "__" in n]
    assert len(names) == 4 + len(inner) + 3  # every function, and none twice
    assert tools.left_out == ["web_search"]
    # MCP's namespaces end in "__": their tools are named as Codex names them
    assert ToolMap.chat_name("mcp__files__", "read") == "mcp__files__read"
    req = ResponsesRequest.model_validate(body)
    chat = responses_chat_body(req, body, input_messages(req.input, tools), tools)
    assert [m["role"] for m in chat["messages"]] == ["developer", "developer", "user", "user"]
    assert chat[DOOR_FIELD] == {
        "api": "responses",
        "not_honoured": ["prompt_cache_key", "client_metadata"],
        "left_out_tools": ["web_search"],
    }


def test_a_call_of_a_namespaced_tool_comes_back_with_its_namespace() -> None:
    tools = ToolMap(codex_body()["tools"])
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "multi_agent_v1__close_agent", "arguments": '{"target": "a"}'},
            }
        ],
    }
    (item,) = output_items(message, "k", tools)
    # what Codex routes on: the bare name and the namespace, never a qualified name
    assert (item["type"], item["name"], item["namespace"]) == (
        "function_call",
        "close_agent",
        "multi_agent_v1",
    )
    # sent back on the next turn, it is the same call in the chat history
    (replayed,) = input_messages([item], tools)
    assert replayed["tool_calls"][0]["function"]["name"] == "multi_agent_v1__close_agent"
    # and streamed, the item that closes carries it too
    req = ResponsesRequest.model_validate({"model": "m", "input": "x", "stream": True})
    stream = ResponsesStream(req, "resp_1", "k", tools)
    chunk = {
        "choices": [
            {"index": 0, "delta": {"tool_calls": [dict(message["tool_calls"][0], index=0)]}}
        ]
    }
    blob = stream.start() + stream.feed(chunk) + stream.finish()
    done = [e["item"] for e in events(blob) if e["type"] == "response.output_item.done"]
    assert [(d["name"], d.get("namespace")) for d in done] == [("close_agent", "multi_agent_v1")]
    assert stream.assistant_message()["tool_calls"][0]["function"]["name"] == (
        "multi_agent_v1__close_agent"
    )


def test_a_freeform_tool_is_a_function_of_one_string_and_its_call_a_custom_call() -> None:
    tools = ToolMap([{"type": "custom", "name": "apply_patch", "description": "patch"}])
    assert tools.tools[0]["function"]["parameters"]["required"] == ["input"]
    message = {
        "tool_calls": [
            {"id": "c", "function": {"name": "apply_patch", "arguments": '{"input": "*** Begin"}'}}
        ]
    }
    (item,) = output_items(message, "k", tools)
    assert (item["type"], item["input"]) == ("custom_tool_call", "*** Begin")
    (replayed,) = input_messages(
        [item, {"type": "custom_tool_call_output", "call_id": "c", "output": "ok"}], tools
    )[:1]
    assert json.loads(replayed["tool_calls"][0]["function"]["arguments"]) == {"input": "*** Begin"}


def test_reasoning_is_given_back_as_an_opaque_token_and_taken_back() -> None:
    tools = ToolMap(None)
    (item,) = output_items({"reasoning_content": "think"}, "k", tools, encrypted=True)
    assert item["summary"] == [] and isinstance(item["encrypted_content"], str)
    # Codex sends it back with `store: false`: taken, and left out of the next prompt
    assert input_messages([item, {"role": "user", "content": "go on"}], tools) == [
        {"role": "user", "content": "go on"}
    ]


def test_codex_names_its_session_and_its_side_requests() -> None:
    record = recorded("codex")[0]
    headers = lower(record["headers"])
    session = "codex-01a21c88-b5ed-71d0-a638-918d141631c6"
    assert agent_call(headers, record["body"]) == AgentCall("codex", session, side=False)
    metadata = json.loads(headers["x-codex-turn-metadata"])
    compaction = dict(
        headers, **{"x-codex-turn-metadata": json.dumps(metadata | {"request_kind": "compaction"})}
    )
    assert agent_call(compaction, {}) == AgentCall("codex", session, side=True)
    subagent = dict(headers, **{"x-openai-subagent": "review"})
    assert agent_call(subagent, {}).side
    assert agent_call({"session-id": "abc"}, {}) == AgentCall("codex", "codex-abc")
    assert agent_call({"content-type": "application/json"}, {}) == NO_AGENT


def test_a_thinking_block_streams_as_claude_code_reads_it() -> None:
    req = MessagesRequest.model_validate(
        {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "x"}]}
    )
    stream = MessagesStream(req, "msg_1")
    chunks = [
        {"choices": [{"index": 0, "delta": {"reasoning_content": "let me "}}]},
        {"choices": [{"index": 0, "delta": {"reasoning_content": "see"}}]},
        {"choices": [{"index": 0, "delta": {"content": "Yes."}, "finish_reason": "stop"}]},
    ]
    blob = stream.start() + b"".join(stream.feed(c) for c in chunks) + stream.end()
    shown = [
        (e["type"], (e.get("delta") or e.get("content_block") or {}).get("type"))
        for e in events(blob)
    ]
    assert shown == [
        ("message_start", None),
        ("ping", None),
        ("content_block_start", "thinking"),
        ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "signature_delta"),  # the last thing before the block ends
        ("content_block_stop", None),
        ("content_block_start", "text"),
        ("content_block_delta", "text_delta"),
        ("content_block_stop", None),
        ("message_delta", None),
        ("message_stop", None),
    ]
    signed = next(
        e for e in events(blob) if (e.get("delta") or {}).get("type") == "signature_delta"
    )
    (whole,) = [
        b for b in content_blocks({"reasoning_content": "let me see"}) if b["type"] == "thinking"
    ]
    assert signed["delta"]["signature"] == whole["signature"] != ""


def openclaw_session() -> list[dict[str, Any]]:
    lines = (AGENTS / "openclaw" / "small-profile-session.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_openclaw_names_its_session_in_its_runtime_line_even_after_a_compaction() -> None:
    calls = [
        agent_call(lower(r["headers"]), r["body"])
        for r in openclaw_session()
        if not r["body"]["messages"][0]["content"].startswith("You are a context summarization")
    ]
    assert len(calls) == 6  # five turns and the one after the compaction
    assert calls == [AgentCall("openclaw", "openclaw-s1")] * 6


def test_openclaws_compaction_calls_are_side_requests_of_no_session() -> None:
    summaries = [r for r in openclaw_session() if not r["body"].get("tools")]
    assert len(summaries) == 8
    for r in summaries:
        assert agent_call(lower(r["headers"]), r["body"]) == AgentCall("openclaw", None, True)


def test_openclaws_affinity_header_names_the_session_before_its_runtime_line() -> None:
    turn = openclaw_session()[0]
    headers = {**lower(turn["headers"]), "x-session-affinity": "demo:0"}
    assert agent_call(headers, turn["body"]) == AgentCall("openclaw", "openclaw-demo:0")


def test_a_runtime_line_outside_openclaws_system_prompt_names_nothing() -> None:
    turn = openclaw_session()[0]
    body = {**turn["body"], "messages": [{"role": "system", "content": "Be brief."}]}
    body["messages"] += turn["body"]["messages"][1:]
    assert agent_call(lower(turn["headers"]), body) == NO_AGENT


def test_the_console_knows_the_agents_the_gateway_names_sessions_after() -> None:
    from claw_stream.agents import recognition
    from claw_stream.agents.names import RECOGNISED, agent_of

    named = set(re.findall(r'_named\("([a-z-]+)"', Path(recognition.__file__).read_text()))
    assert named == set(RECOGNISED)
    assert agent_of("claude-code-5f1e") == "claude-code" and agent_of("s-abc") == ""


# --- opencode, aider, Hermes Agent ----------------------------------------------------------


def test_opencodes_calls_name_its_session_and_its_title_call_is_side() -> None:
    title, turn = recorded("opencode")
    session = turn["headers"]["x-session-id"]
    found = [agent_call(lower(r["headers"]), r["body"]) for r in (title, turn)]
    assert found == [
        AgentCall("opencode", f"opencode-{session}", side=True, own_session_header=True),
        AgentCall("opencode", f"opencode-{session}", side=False, own_session_header=True),
    ]
    # its x-session-affinity is not OpenClaw's: opencode says who it is first
    assert agent_call(lower(turn["headers"]), turn["body"]).agent == "opencode"
    # an X-Session-Id that is not its own id (a static header a user set) keeps its weight
    headers = lower(turn["headers"]) | {"x-session-id": "mine"}
    assert not agent_call(headers, turn["body"]).own_session_header


def test_aider_and_hermes_name_no_session_and_their_side_prompts_are_side() -> None:
    (aider,) = recorded("aider")
    (hermes,) = recorded("hermes")
    assert agent_call(lower(aider["headers"]), aider["body"]) == AgentCall("aider")
    assert agent_call(lower(hermes["headers"]), hermes["body"]) == AgentCall("hermes")
    summary = {
        "messages": [
            {
                "role": "system",
                "content": "*Briefly* summarize this partial conversation about "
                "programming.\nInclude less detail about older parts.",
            },
            {"role": "user", "content": "# USER\nhello"},
        ]
    }
    assert agent_call({}, summary) == AgentCall("aider", side=True)
    title = {
        "messages": [
            {
                "role": "system",
                "content": "Generate a short, descriptive title (3-7 words) for "
                "a conversation that starts with the following exchange.",
            },
            {"role": "user", "content": "User: hi\n\nAssistant: hello"},
        ]
    }
    assert agent_call({}, title) == AgentCall("hermes", side=True)


def test_the_doctor_says_which_agents_fit_the_served_context() -> None:
    from claw_stream.agents.doctor import AGENT_PROMPTS, check_agents_fit

    small = check_agents_fit(8192)
    assert small.outcome == "warn"
    assert "opencode with its small-model profile (~5.3k)" in small.detail
    assert "aider (~0.7k)" in small.detail
    assert "Claude Code (~12.2k), Codex (~9.0k), Gemini CLI (~8.6k) do not: a model of 16,384" in (
        small.detail
    )
    assert "Hermes Agent starts only on 64,000 or more" in small.detail
    wide = check_agents_fit(65536)
    assert wide.outcome == "ok" and all(a.agent in wide.detail for a in AGENT_PROMPTS)
    # the recorded first prompts are the sizes it tells (bytes of the bodies, roughly)
    for agent, size in (("opencode", 31_075), ("aider", 2_911), ("hermes", 61_944)):
        assert abs(len(json.dumps(recorded(agent)[-1]["body"])) - size) < 200
