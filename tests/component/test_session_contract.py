"""AReaL's session contract exactly as its example clients send it, and keys that never lock an
agent out: against a real gateway, engine, broker and Postgres."""

from __future__ import annotations

import time
import uuid

import httpx
import openai
import pytest

from ..support.engine import ADMIN_KEY
from ..support.gateway import GatewayProcess, read_session_events, read_steps
from ..support.postgres import new_database

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
HELLO = [{"role": "user", "content": "hello"}]


def areal_start(gateway: GatewayProcess, **fields) -> httpx.Response:
    """The body AReaL's OpenClaw/ZeroClaw example posts (api_key null: the gateway makes one)."""
    body = {
        "task_id": "demo-task",
        "request_id": str(uuid.uuid4()),
        "request_expires_at": time.time() + 600,
        "api_key": None,
        **fields,
    }
    return httpx.post(gateway.base_url + "/rl/start_session", json=body, headers=ADMIN)


def chat(gateway: GatewayProcess, key: str) -> openai.types.chat.ChatCompletion:
    # AReaL's example: base URL without /v1, model "default"
    client = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key=key, max_retries=0)
    return client.chat.completions.create(model="policy", messages=HELLO, max_tokens=3)


def test_areal_start_session_retry_expiry_and_task(gateway: GatewayProcess) -> None:
    assert httpx.get(gateway.base_url + "/healthz").status_code == 200
    request_id = str(uuid.uuid4())
    expires = time.time() + 600
    first = areal_start(gateway, request_id=request_id, request_expires_at=expires)
    assert first.status_code == 200, first.text
    answer = first.json()
    assert answer["session_id"].startswith("demo-task-") and answer["task_id"] == "demo-task"
    assert answer["api_key"].startswith("claw-sk-")
    assert answer["sessions"] == [
        {"session_id": answer["session_id"], "api_key": answer["api_key"]}
    ]
    # a retry (lost answer, client timeout) gets the same answer and starts nothing new
    retry = areal_start(gateway, request_id=request_id, request_expires_at=expires)
    assert retry.status_code == 200 and retry.json() == answer
    # ... even once the request has expired: it was served
    late = areal_start(gateway, request_id=request_id, request_expires_at=expires)
    assert late.json() == answer
    events = read_session_events(gateway.bootstrap, {answer["session_id"]})
    assert [e.kind for e in events] == ["started"]
    assert chat(gateway, answer["api_key"]).choices[0].message is not None
    # the same request_id with another body is a mistake, not a retry
    reused = areal_start(gateway, request_id=request_id, task_id="other-task")
    assert reused.status_code == 409 and reused.json()["error"]["param"] == "request_id"
    # an expired request is refused and starts nothing
    expired = areal_start(gateway, request_expires_at=time.time() - 5)
    assert expired.status_code == 400
    error = expired.json()["error"]
    assert error["param"] == "request_expires_at" and "expired" in error["message"]
    bad = areal_start(gateway, task_id="no spaces/or slashes")
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "task_id"


def test_group_size_gives_one_session_per_member_in_one_group(gateway: GatewayProcess) -> None:
    r = areal_start(gateway, group_size=3)
    assert r.status_code == 200, r.text
    answer = r.json()
    members = answer["sessions"]
    assert len(members) == 3 and answer["group_id"]
    assert len({m["session_id"] for m in members}) == len({m["api_key"] for m in members}) == 3
    for member in members:
        chat(gateway, member["api_key"])
    steps = read_steps(gateway.bootstrap, {m["session_id"] for m in members})
    assert sorted(s.session_id for s in steps) == sorted(m["session_id"] for m in members)
    assert {s.group_id for s in steps} == {answer["group_id"]}
    one_key = areal_start(gateway, group_size=2, api_key="claw-sk-" + uuid.uuid4().hex)
    assert one_key.status_code == 422 and "group_size" in one_key.json()["error"]["message"]


def test_set_reward_by_interaction_id_and_refresh_default(gateway: GatewayProcess) -> None:
    key = "claw-sk-" + uuid.uuid4().hex
    session = areal_start(gateway, api_key=key).json()
    sid = session["session_id"]
    completions = [chat(gateway, key) for _ in range(2)]
    headers = {"Authorization": f"Bearer {key}"}
    r = httpx.post(
        gateway.base_url + "/rl/set_reward",
        json={"reward": 1.0, "interaction_id": completions[0].id},
        headers=headers,
        timeout=60,
    )
    assert r.status_code == 200, r.text
    wrong = httpx.post(
        gateway.base_url + "/rl/set_reward",
        json={"reward": 1.0, "interaction_id": "chatcmpl-not-ours"},
        headers=headers,
    )
    assert wrong.status_code == 422 and wrong.json()["error"]["param"] == "interaction_id"
    # refresh (same key, no episode reward set): the old session ends with reward 0 (AReaL)
    refreshed = areal_start(gateway, api_key=key).json()
    assert refreshed["ended_session_id"] == sid
    steps = read_steps(gateway.bootstrap, {sid})
    assert [f"chatcmpl-{s.step_id.hex}" for s in steps] == [c.id for c in completions]
    events = read_session_events(gateway.bootstrap, {sid})
    assert [(e.kind, e.step_id, e.reward) for e in events] == [
        ("started", None, None),
        ("reward", steps[0].step_id, 1.0),  # the completion it named
        ("reward", None, 0.0),  # the refresh default
        ("refreshed", None, None),
    ]
    # with an episode reward set, the refresh adds none
    second = refreshed["session_id"]
    chat(gateway, key)
    httpx.post(gateway.base_url + "/rl/set_reward", json={"reward": -1.0}, headers=headers)
    areal_start(gateway, api_key=key)
    kinds = [(e.kind, e.reward) for e in read_session_events(gateway.bootstrap, {second})]
    assert kinds == [("started", None), ("reward", -1.0), ("refreshed", None)]


@pytest.fixture(scope="module")
def idle_gateway(broker, postgres, tools_engine, tmp_path_factory):
    # a database of its own: its 1 s idle sweep would end every other test's sessions
    proc = GatewayProcess(
        broker,
        new_database(postgres, "idle"),
        [tools_engine.base_url],
        tmp_path_factory.mktemp("idle-gw"),
        env={"CLAW_GATEWAY__SESSION_IDLE_TIMEOUT_S": "1"},
    )
    yield proc
    proc.stop()


def test_a_key_never_locks_its_agent_out(idle_gateway: GatewayProcess) -> None:
    """One agent, one key, a conversation across an idle close and an explicit end: every call
    is answered, and each part lands in a session of its own, announced as a new episode."""
    key = httpx.post(idle_gateway.base_url + "/rl/start_session", json={}, headers=ADMIN).json()[
        "api_key"
    ]
    first = chat(idle_gateway, key)
    time.sleep(3)  # the sweep (every idle/4 s) ends the idle session
    second = chat(idle_gateway, key)
    r = httpx.post(
        idle_gateway.base_url + "/rl/end_session",
        json={},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200
    third = chat(idle_gateway, key)
    steps = {f"chatcmpl-{s.step_id.hex}": s for s in read_steps(idle_gateway.bootstrap)}
    sessions = [steps[c.id].session_id for c in (first, second, third)]
    assert len(set(sessions)) == 3
    started = [e for e in read_session_events(idle_gateway.bootstrap, set(sessions[1:]))]
    reasons = [(e.session_id, e.reason) for e in started if e.kind == "started"]
    assert reasons == [
        (sessions[1], f"key reused after {sessions[0]} ended"),
        (sessions[2], f"key reused after {sessions[1]} ended"),
    ]


def test_strict_keys_refuse_a_key_whose_session_ended(
    broker, database, tools_engine, tmp_path_factory
) -> None:
    proc = GatewayProcess(
        broker,
        database,
        [tools_engine.base_url],
        tmp_path_factory.mktemp("strict-gw"),
        env={"CLAW_GATEWAY__STRICT_KEYS": "true"},
    )
    try:
        key = httpx.post(proc.base_url + "/rl/start_session", json={}, headers=ADMIN).json()[
            "api_key"
        ]
        chat(proc, key)
        httpx.post(
            proc.base_url + "/rl/end_session", json={}, headers={"Authorization": f"Bearer {key}"}
        )
        with pytest.raises(openai.AuthenticationError, match="has ended"):
            chat(proc, key)
    finally:
        proc.stop()


def test_session_metadata_reaches_the_session_events(gateway: GatewayProcess) -> None:
    """Ground truth for reward sources: passed at start_session and set_reward, carried by the
    session's events to the worker; too much of it is refused, not cut."""
    started = areal_start(gateway, metadata={"answer": 42, "task": "6 * 7"})
    assert started.status_code == 200, started.text
    sid, key = started.json()["session_id"], started.json()["api_key"]
    reward = httpx.post(
        gateway.base_url + "/rl/set_reward",
        json={"reward": 1.0, "metadata": {"tests_passed": 7}},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert reward.status_code == 200, reward.text
    events = read_session_events(gateway.bootstrap, {sid})
    assert [(e.kind, e.metadata) for e in events] == [
        ("started", {"answer": 42, "task": "6 * 7"}),
        ("reward", {"tests_passed": 7}),
    ]
    huge = areal_start(gateway, metadata={"x": "y" * 70_000})
    assert huge.status_code == 422 and "65536 bytes" in huge.json()["error"]["message"]
