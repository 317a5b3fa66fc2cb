"""Each seed client configured exactly as its own docs say, against a real gateway, engine,
broker and Postgres: Claw-R1's quick start, AReaL's example, ZeroClaw's provider; every API
under every base URL a client may use; any model name reaching the policy unless the gateway
is strict."""

from __future__ import annotations

import time
import uuid

import httpx
import openai
import pytest

from ..support.engine import ADMIN_KEY
from ..support.gateway import OTHER, GatewayProcess, read_session_events, read_steps

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def test_claw_r1_quick_start(gateway: GatewayProcess) -> None:
    """Claw-R1: the trajectory and prompt ids are the base URL (no /v1); any model name."""
    traj_uid, prompt_uid = f"traj-{uuid.uuid4().hex[:8]}", f"prompt-{uuid.uuid4().hex[:8]}"
    client = openai.OpenAI(
        base_url=f"{gateway.base_url}/{traj_uid}/{prompt_uid}", api_key="not-used", max_retries=0
    )
    answer = client.chat.completions.create(model="your-model-name", messages=OTHER, max_tokens=4)
    assert answer.model == "your-model-name"  # the name it asked for, not the engine's
    (step,) = read_steps(gateway.bootstrap, {traj_uid})
    assert (step.session_id, step.group_id) == (traj_uid, prompt_uid)
    assert (step.request.model, step.served_model) == ("your-model-name", "policy")
    assert f"chatcmpl-{step.step_id.hex}" == answer.id
    # its reward: the trajectory named in the body, with the same (unused) key
    reward = httpx.post(
        gateway.base_url + "/rl/set_reward",
        json={"reward": 1.0, "session_id": traj_uid},
        headers={"Authorization": "Bearer not-used"},
    )
    assert reward.status_code == 200, reward.text
    events = read_session_events(gateway.bootstrap, {traj_uid})
    assert [(e.kind, e.reward) for e in events if e.kind == "reward"] == [("reward", 1.0)]


def test_areal_example(gateway: GatewayProcess) -> None:
    """AReaL: GET /health, start_session with its own body, chat at the root with model
    "default", then a reward."""
    # the gateway checks its engine every 5 s (2 s to answer): one that a test beside this one
    # kept busy may be marked unhealthy for a check or two; AReaL waits for /health too
    deadline = time.monotonic() + 30
    while (health := httpx.get(gateway.base_url + "/health")).status_code != 200:
        assert time.monotonic() < deadline, health.text
        time.sleep(0.5)
    assert health.json()["healthy_engines"] == 1
    started = httpx.post(
        gateway.base_url + "/rl/start_session",
        json={
            "task_id": "demo-task",
            "request_id": str(uuid.uuid4()),
            "request_expires_at": time.time() + 600,
            "api_key": None,
        },
        headers=ADMIN,
    )
    assert started.status_code == 200, started.text
    session_id, key = started.json()["session_id"], started.json()["api_key"]
    # OPENAI_BASE_URL=http://HOST:8000: the SDK posts to {base}/chat/completions
    client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
    answer = client.chat.completions.create(model="default", messages=OTHER, max_tokens=4)
    assert answer.model == "default"
    reward = httpx.post(
        gateway.base_url + "/rl/set_reward",
        json={"reward": 1.0, "interaction_id": answer.id},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert reward.status_code == 200, reward.text
    (step,) = read_steps(gateway.bootstrap, {session_id})
    assert (step.request.model, step.served_model) == ("default", "policy")
    events = read_session_events(gateway.bootstrap, {session_id})
    assert [(e.kind, e.step_id, e.reward) for e in events] == [
        ("started", None, None),
        ("reward", step.step_id, 1.0),
    ]


def test_zeroclaw_provider(gateway: GatewayProcess) -> None:
    """ZeroClaw with the seed's config.toml (`base_url = "http://<gateway>"`, `wire_api =
    "chat_completions"`, `default_model = "Qwen/Qwen3-0.6B"`, the session key from AReaL's
    start_session as `api_key`): it sends only its key and its own body, no session header;
    its fallback (`{base_url}/v1/responses`) answers too; the example then sets the reward."""
    started = httpx.post(
        gateway.base_url + "/rl/start_session",
        json={
            "task_id": "demo-task",
            "request_id": str(uuid.uuid4()),
            "request_expires_at": time.time() + 600,
            "api_key": None,
        },
        headers=ADMIN,
    )
    assert started.status_code == 200, started.text
    session, key = started.json()["session_id"], started.json()["api_key"]
    headers = {"Authorization": f"Bearer {key}"}
    # ZeroClaw's compatible provider body: no max_tokens, stream false
    body = {"model": "Qwen/Qwen3-0.6B", "messages": OTHER, "temperature": 0.7, "stream": False}
    r = httpx.post(gateway.base_url + "/chat/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "Qwen/Qwen3-0.6B"
    fallback = httpx.post(
        gateway.base_url + "/v1/responses",
        json={"model": "Qwen/Qwen3-0.6B", "input": OTHER, "stream": False},
        headers=headers,
        timeout=60,
    )
    assert fallback.status_code == 200, fallback.text
    assert fallback.json()["model"] == "Qwen/Qwen3-0.6B"
    reward = httpx.post(gateway.base_url + "/rl/set_reward", json={"reward": -1.0}, headers=headers)
    assert reward.status_code == 200, reward.text
    steps = read_steps(gateway.bootstrap, {session})
    assert [s.request.model for s in steps] == ["Qwen/Qwen3-0.6B"] * 2
    assert [s.turn_index for s in steps] == [0, 1]
    events = read_session_events(gateway.bootstrap, {session})
    assert [(e.kind, e.step_id, e.reward) for e in events] == [
        ("started", None, None),
        ("reward", None, -1.0),  # no step named: the episode's reward
    ]


CALLS = {
    "chat/completions": {"messages": OTHER, "max_tokens": 2},
    "responses": {"input": "Tell me something.", "max_output_tokens": 2},
    "messages": {"messages": OTHER, "max_tokens": 2},
}


@pytest.mark.parametrize("prefix", ["", "/v1", "/{s}/v1", "/{s}/{g}", "/{s}/{g}/v1"])
def test_every_api_answers_under_every_prefix(gateway: GatewayProcess, prefix: str) -> None:
    session, group = f"pre-{uuid.uuid4().hex[:8]}", "grp"
    base = gateway.base_url + prefix.format(s=session, g=group)
    headers = {} if "{s}" in prefix else {"X-Session-Id": session}
    models = httpx.get(base + "/models", headers=headers)
    assert models.status_code == 200 and models.json()["data"][0]["id"] == "policy"
    legacy = httpx.post(
        f"{base}/completions",
        json={"model": "m", "prompt": "Once upon a time", "max_tokens": 2},
        headers=headers,
        timeout=60,
    )
    assert legacy.status_code == 200, legacy.text
    assert legacy.json()["model"] == "m" and "x-claw-step-id" not in legacy.headers  # no Step
    step_ids = []
    for path, call in CALLS.items():
        r = httpx.post(f"{base}/{path}", json={"model": "m", **call}, headers=headers, timeout=60)
        assert r.status_code == 200, (path, r.text)
        step_ids.append(r.headers["x-claw-step-id"])
    steps = read_steps(gateway.bootstrap, {session})
    assert [str(s.step_id) for s in steps] == step_ids
    assert {s.group_id for s in steps} == {group if "{g}" in prefix else None}


def test_a_session_segment_without_group_or_v1_is_no_route(gateway: GatewayProcess) -> None:
    """`/{session}/chat/completions` would read as legacy completions for group "chat"; it is
    a 404 instead, in OpenAI's shape."""
    r = httpx.post(
        gateway.base_url + "/abc/chat/completions",
        json={"model": "m", "messages": OTHER},
        timeout=60,
    )
    assert r.status_code in (404, 405) and "error" in r.json()


@pytest.fixture(scope="module")
def strict_gateway(broker, database, tools_engine, tmp_path_factory):
    proc = GatewayProcess(
        broker,
        database,
        [tools_engine.base_url],
        tmp_path_factory.mktemp("strict-gw"),
        env={
            "CLAW_GATEWAY__STRICT_MODELS": "true",
            "CLAW_GATEWAY__MODEL_MAP": '{"default": "policy"}',
        },
    )
    yield proc
    proc.stop()


def test_strict_gateway_refuses_unknown_names_and_maps_configured_ones(
    strict_gateway: GatewayProcess,
) -> None:
    session = f"strict-{uuid.uuid4().hex[:8]}"
    headers = {"X-Session-Id": session}
    url = strict_gateway.base_url + "/v1/chat/completions"
    refused = httpx.post(
        url, json={"model": "your-model-name", "messages": OTHER}, headers=headers, timeout=60
    )
    assert refused.status_code == 404
    assert refused.json()["error"]["param"] == "model"
    messages = httpx.post(
        strict_gateway.base_url + "/v1/messages",
        json={"model": "claude-x", "messages": OTHER, "max_tokens": 2},
        headers=headers,
        timeout=60,
    )
    assert messages.status_code == 404
    assert messages.json()["error"]["type"] == "not_found_error"
    for model in ("default", "policy"):
        r = httpx.post(
            url,
            json={"model": model, "messages": OTHER, "max_tokens": 2},
            headers=headers,
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert r.json()["model"] == model
    steps = read_steps(strict_gateway.bootstrap, {session})
    assert [(s.request.model, s.served_model) for s in steps] == [
        ("default", "policy"),
        ("policy", "policy"),
    ]
    # the refusals made no Step and kept no turn index
    assert [s.turn_index for s in steps] == [0, 1]
