"""Calls without a session id join the session whose main line they extend: the pure matching
on real OpenClaw request bodies, then a real gateway."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import httpx
import pytest

from claw_stream.gateway.main_lines import heads, prefix_hashes

from .gateway_helpers import GatewayProcess, read_steps

# ../shared beside the checkout (CI), or where CLAW_SHARED says (a git worktree elsewhere)
SHARED = Path(os.environ.get("CLAW_SHARED", Path(__file__).resolve().parents[2] / "shared"))
FIXTURES = SHARED / "fixtures" / "openclaw"


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


@pytest.mark.slow
def test_a_conversation_without_session_ids_stays_one_session(gateway: GatewayProcess) -> None:
    system = {"role": "system", "content": f"You are agent {uuid.uuid4().hex}."}

    def call(messages: list[dict]) -> tuple[dict, str]:
        r = httpx.post(
            gateway.base_url + "/v1/chat/completions",
            json={"model": "policy", "messages": messages, "max_tokens": 4},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"], r.headers["x-claw-step-id"]

    context = {"role": "user", "content": "<<context of this call only>>"}
    first = [system, {"role": "user", "content": "hello"}]
    reply1, step1 = call([*first, context])
    second = [*first, reply1, {"role": "user", "content": "and then?"}]
    reply2, step2 = call([*second, context])
    _, step3 = call([*second, reply2, {"role": "user", "content": "thanks"}])
    _, other = call([system, {"role": "user", "content": "a different conversation"}])
    steps = {str(s.step_id): s for s in read_steps(gateway.bootstrap)}
    sessions = [steps[s].session_id for s in (step1, step2, step3)]
    assert len(set(sessions)) == 1 and sessions[0].startswith("c-")
    assert [steps[s].turn_index for s in (step1, step2, step3)] == [0, 1, 2]
    assert steps[other].session_id != sessions[0]
