"""Calls without a session id join the session whose main line they extend, on a real gateway."""

from __future__ import annotations

import uuid

import httpx

from ..support.gateway import GatewayProcess, read_steps


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
