"""Calls without a session id join the session whose main line they extend: the matching, on
real OpenClaw request bodies."""

from __future__ import annotations

import json

from claw_stream.gateway.sessions.main_lines import heads, prefix_hashes

from ..support.paths import AGENTS

FIXTURES = AGENTS / "openclaw"


def openclaw_bodies() -> list[dict]:
    lines = (FIXTURES / "session.jsonl").read_text().splitlines()
    return [json.loads(line)["body"] for line in lines]


def extends(previous: dict, reply: dict, following: dict) -> bool:
    return bool(
        set(heads(previous["messages"], reply)) & set(prefix_hashes(following["messages"])[:-1])
    )


def test_openclaw_calls_extend_the_line_of_the_call_before() -> None:
    bodies = openclaw_bodies()
    # OpenClaw's calls 1-3 are one session (tool call, tool result, next turn); 4-5 another
    for earlier, later in ((0, 1), (1, 2), (3, 4)):
        previous, following = bodies[earlier], bodies[later]
        # the answer the endpoint gave, as OpenClaw echoes it back in its next request
        n_kept = len(previous["messages"]) - 1  # the trailing context message is not kept
        reply = following["messages"][n_kept]
        assert reply["role"] == "assistant"
        assert extends(previous, reply, following), (earlier, later)
    # a call of the other session does not extend this one's line
    reply = bodies[1]["messages"][2]
    assert not extends(bodies[0], reply, bodies[4])
    assert not extends(bodies[3], bodies[4]["messages"][2], bodies[2])


def test_echoed_answers_match_whatever_the_client_reserialised() -> None:
    request = [{"role": "system", "content": "s"}, {"role": "user", "content": "weather?"}]
    answer = {
        "role": "assistant",
        "content": None,
        "reasoning_content": "the user wants weather",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'},
            }
        ],
    }
    echoed = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"unit":"c","city":"Paris"}'},
            }
        ],
    }
    following = [*request, echoed, {"role": "tool", "tool_call_id": "call_1", "content": "9 C"}]
    assert set(heads(request, answer)) & set(prefix_hashes(following))
    changed = [*request, {**echoed, "content": "something else"}, following[-1]]
    assert not set(heads(request, answer)) & set(prefix_hashes(changed))
