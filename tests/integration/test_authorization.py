"""The authorization matrix against a real gateway: every route, credential and session.

A refused request answers 401/403 in OpenAI's error shape and publishes nothing: every request
that should be refused names a victim session that nothing else touches, and the victim's
topics are read at the end.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import pytest

from ..support.engine import ADMIN_KEY
from ..support.gateway import GatewayProcess, read_session_events, read_steps

pytestmark = pytest.mark.slow
CLIENT_KEY = "client-key-for-tests"
CHAT = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
RESPONSES = {"model": "default", "input": "hi", "max_output_tokens": 2}
MESSAGES = {"model": "claude", "messages": CHAT["messages"], "max_tokens": 2}


@pytest.fixture(scope="module")
def guarded(broker, database, tools_engine, tmp_path_factory):
    """A gateway with a client key: `none` and a wrong key are then told apart from it."""
    proc = GatewayProcess(
        broker,
        database,
        [tools_engine.base_url],
        tmp_path_factory.mktemp("guarded"),
        env={"CLAW_GATEWAY__CLIENT_KEY": CLIENT_KEY},
    )
    yield proc
    proc.stop()


def start(gateway: GatewayProcess) -> dict:
    r = httpx.post(
        gateway.base_url + "/rl/start_session",
        json={},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    )
    assert r.status_code == 200, r.text
    return r.json()


def bearer(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


# How each route names the session it acts on: (method path, body, extra headers) for a target.
Request = tuple[str, dict, dict[str, str]]
ROUTES: dict[str, Callable[[str], Request]] = {
    "chat, X-Session-Id": lambda s: ("/v1/chat/completions", CHAT, {"X-Session-Id": s}),
    "chat, URL path": lambda s: (f"/{s}/g1/v1/chat/completions", CHAT, {}),
    "responses, X-Session-Id": lambda s: ("/responses", RESPONSES, {"X-Session-Id": s}),
    "responses, URL path": lambda s: (f"/{s}/g1/responses", RESPONSES, {}),
    "set_reward, body": lambda s: ("/rl/set_reward", {"reward": 1.0, "session_id": s}, {}),
    "set_reward, header": lambda s: ("/rl/set_reward", {"reward": -1.0}, {"X-Session-Id": s}),
    "feedback, body": lambda s: ("/rl/feedback", {"score": 1, "session_id": s}, {}),
    "feedback, header": lambda s: ("/rl/feedback", {"text": "meh"}, {"X-Session-Id": s}),
    "end_session, body": lambda s: ("/rl/end_session", {"session_id": s}, {}),
}


@dataclass
class Case:
    credential: str
    target: str  # "own" (the session key's own session, or one the caller may name) | "other"
    expected: int


# The matrix, as README's security section states it, for the session routes and model calls.
SESSION_MATRIX = [
    Case("admin", "own", 200),
    Case("admin", "other", 200),
    Case("client", "own", 200),  # the client key acts on the session it names (OpenClaw-RL)
    Case("client", "other", 200),
    Case("session", "own", 200),
    Case("session", "other", 403),  # a session key acts only on its own session
    Case("none", "own", 401),
    Case("wrong", "own", 401),
]


def test_every_route_every_credential_own_and_other_session(guarded: GatewayProcess) -> None:
    victim = start(guarded)["session_id"]  # only refused requests name it
    refused: list[str] = []
    for case in SESSION_MATRIX:
        own, other = start(guarded), start(guarded)
        key = {
            "admin": ADMIN_KEY,
            "client": CLIENT_KEY,
            "session": own["api_key"],
            "none": None,
            "wrong": "claw-sk-not-a-key-of-anyone",
        }[case.credential]
        target = own["session_id"] if case.target == "own" else other["session_id"]
        if case.expected != 200:
            target = victim
        for name, build in ROUTES.items():
            path, body, headers = build(target)
            r = httpx.post(
                guarded.base_url + path, json=body, headers={**bearer(key), **headers}, timeout=60
            )
            where = f"{case.credential} on {case.target} session, {name}"
            assert r.status_code == case.expected, (where, r.text)
            if case.expected != 200:
                error = r.json()["error"]
                assert error["message"] and error["code"] == case.expected, where
                if case.expected == 403:
                    assert "only on its own session" in error["message"], where
                refused.append(where)
            elif path.startswith("/rl/") and name != "end_session, body":
                assert r.json()["session_id"] == target, where
        if case.credential == "session" and case.expected == 200:
            # naming nothing, a session key acts on its own session
            r = httpx.post(
                guarded.base_url + "/rl/set_reward", json={"reward": 0.5}, headers=bearer(key)
            )
            assert r.status_code == 200 and r.json()["session_id"] == own["session_id"]
    assert len(refused) == 3 * len(ROUTES)
    # nothing was published for the victim but its start
    assert read_steps(guarded.bootstrap, {victim}) == []
    assert [e.kind for e in read_session_events(guarded.bootstrap, {victim})] == ["started"]


def test_messages_take_anthropics_key_header_and_refuse_in_its_shape(
    guarded: GatewayProcess,
) -> None:
    """Anthropic clients send their key as `x-api-key`: the same matrix holds, and refusals
    come in Anthropic's error shape."""
    own, other = start(guarded), start(guarded)
    url = guarded.base_url + "/v1/messages"
    key = {"x-api-key": own["api_key"], "anthropic-version": "2023-06-01"}
    ok = httpx.post(url, json=MESSAGES, headers=key, timeout=60)
    assert ok.status_code == 200, ok.text
    (step,) = read_steps(guarded.bootstrap, {own["session_id"]})
    assert ok.json()["id"] == f"msg_{step.step_id.hex}"
    cases = [
        ({**key, "X-Session-Id": other["session_id"]}, 403, "permission_error"),
        ({"x-api-key": "claw-sk-not-a-key-of-anyone"}, 401, "authentication_error"),
        ({}, 401, "authentication_error"),
    ]
    for headers, status, kind in cases:
        r = httpx.post(url, json=MESSAGES, headers=headers, timeout=60)
        assert r.status_code == status, r.text
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == kind
    assert read_steps(guarded.bootstrap, {other["session_id"]}) == []


@pytest.mark.parametrize("credential", ["client", "session", "none", "wrong"])
def test_admin_routes_take_only_the_admin_key(guarded: GatewayProcess, credential: str) -> None:
    session = start(guarded)
    key = {
        "client": CLIENT_KEY,
        "session": session["api_key"],
        "none": None,
        "wrong": "wrong-key-123",
    }[credential]
    for path, body in (
        ("/rl/start_session", {}),
        ("/rl/revoke_key", {"api_key": session["api_key"]}),
    ):
        r = httpx.post(guarded.base_url + path, json=body, headers=bearer(key))
        assert r.status_code == 401, (credential, path, r.text)
        message = "invalid API key" if credential == "wrong" else "admin key required"
        assert r.json()["error"]["message"].startswith(message)
    # the key was not revoked: it still serves its session
    r = httpx.post(
        guarded.base_url + "/v1/chat/completions", json=CHAT, headers=bearer(session["api_key"])
    )
    assert r.status_code == 200


def test_a_revoked_key_gets_401_and_the_others_keep_working(guarded: GatewayProcess) -> None:
    mine, theirs = start(guarded), start(guarded)
    r = httpx.post(
        guarded.base_url + "/rl/revoke_key",
        json={"api_key": mine["api_key"]},
        headers=bearer(ADMIN_KEY),
    )
    assert r.status_code == 200 and r.json() == {"session_id": mine["session_id"], "ended": True}
    for path, body in (("/v1/chat/completions", CHAT), ("/rl/set_reward", {"reward": 1.0})):
        r = httpx.post(guarded.base_url + path, json=body, headers=bearer(mine["api_key"]))
        assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]
    r = httpx.post(
        guarded.base_url + "/v1/chat/completions", json=CHAT, headers=bearer(theirs["api_key"])
    )
    assert r.status_code == 200
    unknown = httpx.post(
        guarded.base_url + "/rl/revoke_key",
        json={"api_key": "claw-sk-" + uuid.uuid4().hex},
        headers=bearer(ADMIN_KEY),
    )
    assert unknown.status_code == 404
    events = read_session_events(guarded.bootstrap, {mine["session_id"]})
    assert [(e.kind, e.reason) for e in events][-1] == ("ended", "revoked")
