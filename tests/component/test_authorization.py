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


COMPLETION = {"model": "policy", "prompt": "hi", "max_tokens": 2}
# the mark each allowed request leaves on the broker: a Step, a SessionEvent of a kind, nothing
STEP = "step"


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    body: dict | None
    headers: dict[str, str]
    leaves: str | None  # STEP, a SessionEvent kind, or None (models, legacy completions)


# Every route and every place it can name the session it acts on, for a target session.
# end_session comes last: the session routes before it still find the session open.
ROUTES: dict[str, Callable[[str], Call]] = {
    "chat, URL path": lambda s: Call("POST", f"/{s}/g1/v1/chat/completions", CHAT, {}, STEP),
    "chat, X-Session-Id": lambda s: Call(
        "POST", "/v1/chat/completions", CHAT, {"X-Session-Id": s}, STEP
    ),
    "chat, body": lambda s: Call("POST", "/chat/completions", {**CHAT, "session_id": s}, {}, STEP),
    "completions, URL path": lambda s: Call("POST", f"/{s}/g1/completions", COMPLETION, {}, None),
    "completions, X-Session-Id": lambda s: Call(
        "POST", "/v1/completions", COMPLETION, {"X-Session-Id": s}, None
    ),
    "completions, body": lambda s: Call(
        "POST", "/v1/completions", {**COMPLETION, "session_id": s}, {}, None
    ),
    "responses, URL path": lambda s: Call("POST", f"/{s}/g1/responses", RESPONSES, {}, STEP),
    "responses, X-Session-Id": lambda s: Call(
        "POST", "/responses", RESPONSES, {"X-Session-Id": s}, STEP
    ),
    "responses, body": lambda s: Call(
        "POST", "/v1/responses", {**RESPONSES, "session_id": s}, {}, STEP
    ),
    "messages, URL path": lambda s: Call("POST", f"/{s}/g1/v1/messages", MESSAGES, {}, STEP),
    "messages, X-Session-Id": lambda s: Call(
        "POST", "/v1/messages", MESSAGES, {"X-Session-Id": s}, STEP
    ),
    "models, URL path": lambda s: Call("GET", f"/{s}/g1/v1/models", None, {}, None),
    "models, X-Session-Id": lambda s: Call("GET", "/v1/models", None, {"X-Session-Id": s}, None),
    "set_reward, body": lambda s: Call(
        "POST", "/rl/set_reward", {"reward": 1.0, "session_id": s}, {}, "reward"
    ),
    "set_reward, header": lambda s: Call(
        "POST", "/rl/set_reward", {"reward": -1.0}, {"X-Session-Id": s}, "reward"
    ),
    "feedback, body": lambda s: Call(
        "POST", "/rl/feedback", {"score": 1, "session_id": s}, {}, "feedback"
    ),
    "feedback, header": lambda s: Call(
        "POST", "/rl/feedback", {"text": "meh"}, {"X-Session-Id": s}, "feedback"
    ),
    "end_session, header": lambda s: Call(
        "POST", "/rl/end_session", {}, {"X-Session-Id": s}, "ended"
    ),
    "end_session, body": lambda s: Call("POST", "/rl/end_session", {"session_id": s}, {}, "ended"),
}


@dataclass
class Case:
    credential: str
    target: str  # "own" (the session key's own session, or one the caller may name) | "other"
    expected: int


# The matrix, as docs/operations/security.md states it, for the session routes and model calls.
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


def send(gateway: GatewayProcess, call: Call, key: str | None) -> httpx.Response:
    headers = {**bearer(key), **call.headers}
    return httpx.request(
        call.method, gateway.base_url + call.path, json=call.body, headers=headers, timeout=60
    )


def refusal(r: httpx.Response) -> dict:
    """The error of a refused request, in OpenAI's shape (Anthropic's for /messages)."""
    body = r.json()
    error = body["error"]
    assert error["message"]
    if body.get("type") == "error":  # Anthropic's shape
        assert error["type"] in ("authentication_error", "permission_error")
    else:
        assert error["code"] == r.status_code and error["type"]
    return error


def marks(gateway: GatewayProcess, sessions: set[str]) -> dict[str, set[str]]:
    """Each session's marks on the broker: STEP, and its SessionEvents' kinds but `started`
    (one read of each topic: reading them is what takes the time here)."""
    found: dict[str, set[str]] = {s: set() for s in sessions}
    for step in read_steps(gateway.bootstrap, sessions):
        found[step.session_id].add(STEP)
    for event in read_session_events(gateway.bootstrap, sessions):
        if event.kind != "started":
            found[event.session_id].add(event.kind)
    return found


def test_every_route_every_credential_own_and_other_session(guarded: GatewayProcess) -> None:
    """Each credential, each route, each place it names a session: the status the matrix
    says, and on the broker exactly the marks of the allowed requests. A refused request
    names a victim session that nothing else touches, and the victim gets nothing."""
    expected: dict[str, set[str]] = {}  # what the broker must hold per session, at the end
    for case in SESSION_MATRIX:
        own, other, victim = start(guarded), start(guarded), start(guarded)["session_id"]
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
        expected.update({own["session_id"]: set(), other["session_id"]: set(), victim: set()})
        for name, build in ROUTES.items():
            call = build(target)
            r = send(guarded, call, key)
            where = f"{case.credential} on {case.target} session, {name}"
            assert r.status_code == case.expected, (where, r.text)
            if case.expected != 200:
                error = refusal(r)
                if case.expected == 403:
                    assert "only on its own session" in error["message"], where
                    assert target in error["message"], where
                continue
            if call.path.startswith("/rl/"):
                assert r.json()["session_id"] == target, where
            if call.leaves is not None:
                expected[target].add(call.leaves)
        if case.credential == "session" and case.expected == 200:
            # naming nothing, a session key acts on its own session
            r = send(guarded, Call("POST", "/rl/set_reward", {"reward": 0.5}, {}, None), key)
            assert r.status_code == 200 and r.json()["session_id"] == target, r.text
    assert marks(guarded, set(expected)) == expected


@pytest.mark.parametrize("credential", ["admin", "client"])
def test_a_request_naming_two_sessions_is_a_400(guarded: GatewayProcess, credential: str) -> None:
    """Path, header and body must agree: which one would win is no question to leave open."""
    first, second = start(guarded)["session_id"], start(guarded)["session_id"]
    key = ADMIN_KEY if credential == "admin" else CLIENT_KEY
    calls = [
        Call("POST", f"/{first}/g1/v1/chat/completions", CHAT, {"X-Session-Id": second}, STEP),
        Call(
            "POST",
            "/v1/completions",
            {**COMPLETION, "session_id": second},
            {"X-Session-Id": first},
            None,
        ),
        Call(
            "POST",
            "/rl/set_reward",
            {"reward": 1.0, "session_id": second},
            {"X-Session-Id": first},
            None,
        ),
        Call("POST", "/rl/end_session", {"session_id": second}, {"X-Session-Id": first}, None),
    ]
    for call in calls:
        r = send(guarded, call, key)
        assert r.status_code == 400, (call.path, r.text)
        assert first in refusal(r)["message"] and second in r.json()["error"]["message"]
    assert marks(guarded, {first, second}) == {first: set(), second: set()}


def test_a_session_key_naming_itself_and_another_is_refused(guarded: GatewayProcess) -> None:
    """Its own session in the path or header does not cover another session in the body."""
    own, other = start(guarded), start(guarded)
    mine, theirs = own["session_id"], other["session_id"]
    calls = [
        Call("POST", f"/{mine}/g1/v1/chat/completions", CHAT, {"X-Session-Id": theirs}, None),
        Call(
            "POST",
            "/rl/set_reward",
            {"reward": 1.0, "session_id": theirs},
            {"X-Session-Id": mine},
            None,
        ),
        Call("POST", "/rl/end_session", {"session_id": theirs}, {"X-Session-Id": mine}, None),
    ]
    for call in calls:
        r = send(guarded, call, own["api_key"])
        assert r.status_code == 403, (call.path, r.text)
        assert theirs in refusal(r)["message"]
    assert marks(guarded, {mine, theirs}) == {mine: set(), theirs: set()}


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


def test_a_session_key_continues_only_its_own_keys_responses(guarded: GatewayProcess) -> None:
    """`previous_response_id` carries a conversation: another session key's is unknown to a
    session key (404, as the API says for any unknown id); the admin and client keys, which
    may act on any session, may continue it."""
    mine, theirs = start(guarded), start(guarded)
    url = guarded.base_url + "/v1/responses"
    first = httpx.post(url, json=RESPONSES, headers=bearer(theirs["api_key"]), timeout=60)
    assert first.status_code == 200, first.text
    follow = {**RESPONSES, "previous_response_id": first.json()["id"]}
    r = httpx.post(url, json=follow, headers=bearer(mine["api_key"]), timeout=60)
    assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id"
    for key in (theirs["api_key"], CLIENT_KEY, ADMIN_KEY):
        r = httpx.post(
            url,
            json=follow,
            headers={**bearer(key), "X-Session-Id": theirs["session_id"]},
            timeout=60,
        )
        assert r.status_code == 200, r.text
    assert read_steps(guarded.bootstrap, {mine["session_id"]}) == []


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
        guarded.base_url + "/v1/chat/completions",
        json=CHAT,
        headers=bearer(session["api_key"]),
        timeout=60,
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
        guarded.base_url + "/v1/chat/completions",
        json=CHAT,
        headers=bearer(theirs["api_key"]),
        timeout=60,
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
