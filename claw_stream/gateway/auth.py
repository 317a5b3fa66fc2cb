"""Who is calling, and which session a call may act on: the authorization matrix, in one place.

Credentials (`Authorization: Bearer <key>`, or `x-api-key` as Anthropic clients send it):

- admin key: every route, any session it names.
- client key (`gateway.client_key`; when none is set, any key that is not a session key, and no
  key at all, count as the client key): model calls and the session routes, on the session the
  call names by URL path, `X-Session-Id` or `session_id` in the body (OpenClaw-RL's and
  Claw-R1's conventions); it cannot start sessions or revoke keys.
- session key (from `/rl/start_session`): its own session only. Naming another session by
  path, header or body is a 403, whatever the route.
- none (no key, or a wrong one while a client key is set): 401.

`MATRIX` below is that table as data; `Auth.authorize` enforces it for every route and the
README's security section prints it.
"""

from __future__ import annotations

import hmac
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from claw_stream.dialect import OpenAIError
from claw_stream.gateway.main_lines import MainLines
from claw_stream.gateway.sessions import SessionRow, SessionStore

log = logging.getLogger(__name__)

Credential = Literal["admin", "client", "session", "none"]
RouteKind = Literal["model_call", "session_route", "admin_route"]

# What each credential may do on each kind of route:
#   "any"  any session the call names (or none)
#   "named" the session the call names (or none: a model call then starts or joins one)
#   "own"  only the session its key belongs to; naming another is a 403
#   "no"   refused (401 for no credential, 403 for a credential that lacks the right)
Rule = Literal["any", "named", "own", "no"]
MATRIX: dict[RouteKind, dict[Credential, Rule]] = {
    # /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, /v1/models
    "model_call": {"admin": "any", "client": "named", "session": "own", "none": "no"},
    # /rl/set_reward, /rl/feedback, /rl/end_session
    "session_route": {"admin": "any", "client": "named", "session": "own", "none": "no"},
    # /rl/start_session, /rl/revoke_key
    "admin_route": {"admin": "any", "client": "no", "session": "no", "none": "no"},
}


@dataclass(frozen=True)
class Caller:
    credential: Credential
    key: str | None  # the key it presented
    session: SessionRow | None = None  # a session key's session


@dataclass
class SessionCtx:
    session_id: str
    group_id: str | None
    turn_type: str
    done: bool
    convention: str
    new_episode: str | None = None  # why this call starts a session its key did not have


def check_id(value: str, name: str) -> None:
    if not 0 < len(value) <= 256 or not value.isprintable():
        raise OpenAIError(422, f"{name} must be 1-256 printable characters", param=name)


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key of a request: a bearer token, or Anthropic's `x-api-key`."""
    header = headers.get("authorization", "")
    if header[:7].lower() == "bearer ":
        return header[7:].strip() or None
    return headers.get("x-api-key") or None


class Auth:
    def __init__(
        self,
        admin_key: str,
        client_key: str | None,
        sessions: SessionStore,
        *,
        strict_keys: bool = False,
        lines: MainLines | None = None,
    ):
        self.admin_key = admin_key
        self.client_key = client_key
        self.sessions = sessions
        self.strict_keys = strict_keys
        self.lines = lines

    def is_admin(self, key: str | None) -> bool:
        return key is not None and hmac.compare_digest(key.encode(), self.admin_key.encode())

    def _is_client_key(self, key: str | None) -> bool:
        return (
            key is not None
            and self.client_key is not None
            and hmac.compare_digest(key.encode(), self.client_key.encode())
        )

    async def caller(self, headers: Mapping[str, str]) -> Caller:
        """Which credential a request presents (a session key is looked up)."""
        key = presented_key(headers)
        if self.is_admin(key):
            return Caller("admin", key)
        if self._is_client_key(key):
            return Caller("client", key)
        if key is not None:
            row = await self.sessions.by_key(key)
            if row is not None:
                if row.status == "revoked":
                    raise OpenAIError(401, "this session key was revoked")
                return Caller("session", key, row)
            if self.client_key is not None or key.startswith("claw-sk-"):
                raise OpenAIError(401, "invalid API key")
        if self.client_key is None:
            return Caller("client", key)
        return Caller("none", key)

    async def authorize(
        self, headers: Mapping[str, str], kind: RouteKind, named: str | None
    ) -> tuple[Caller, str | None]:
        """The caller and the session the request acts on, by `MATRIX`: the named session,
        or a session key's own one; 401/403 where the matrix says no."""
        caller = await self.caller(headers)
        rule = MATRIX[kind][caller.credential]
        if rule == "no":
            if kind == "admin_route":
                raise OpenAIError(401, "admin key required (Authorization: Bearer <admin key>)")
            if caller.credential == "none":
                raise OpenAIError(401, "an API key is required")
            raise OpenAIError(403, "this route needs the admin key or the session's own key")
        if rule == "own":
            assert caller.session is not None
            own = caller.session.session_id
            if named is not None and named != own:
                raise OpenAIError(
                    403,
                    f"a session key acts only on its own session ({own}); "
                    f"it cannot act on session {named}",
                    param="session_id",
                )
            return caller, own
        return caller, named

    async def resolve(
        self,
        headers: Mapping[str, str],
        body: dict[str, Any],
        path_session: str | None,
        path_group: str | None,
    ) -> SessionCtx:
        """The session of a model call; pops the session fields from `body`."""
        body_session = body.pop("session_id", None)
        turn_type = headers.get("x-turn-type") or body.pop("turn_type", None) or "main"
        body.pop("turn_type", None)
        done_header = headers.get("x-session-done")
        done = (done_header or "").lower() in ("1", "true", "yes") or bool(
            body.pop("session_done", False)
        )
        if turn_type not in ("main", "side"):
            raise OpenAIError(422, "X-Turn-Type must be main or side", param="turn_type")
        named = path_session or headers.get("x-session-id") or body_session
        caller, session_id = await self.authorize(headers, "model_call", named)
        if caller.session is not None:
            row, new_episode = caller.session, None
            if row.status != "active":
                row, new_episode = await self._next_episode(caller)
            return SessionCtx(row.session_id, row.group_id, turn_type, done, "api_key", new_episode)
        convention = "path" if path_session else "header"
        if not session_id:
            session_id, convention = await self._by_main_line(body), "prefix"
        check_id(session_id, "session_id")
        if path_group is not None:
            check_id(path_group, "group_id")
        return SessionCtx(
            session_id, path_group or headers.get("x-group-id"), turn_type, done, convention
        )

    async def _by_main_line(self, body: dict[str, Any]) -> str:
        """A call that names no session: the one whose main line it extends, else a new one."""
        messages = body.get("messages")
        if self.lines is not None and isinstance(messages, list):
            try:
                joined = await self.lines.join(messages)
            except Exception as exc:  # the call goes on, in a session of its own
                log.warning("cannot look up main lines: %r", exc)
            else:
                if joined is not None:
                    return joined
        return f"c-{uuid.uuid4().hex}"

    async def _next_episode(self, caller: Caller) -> tuple[SessionRow, str | None]:
        """A key whose session ended (or idled) starts the next episode: same key, a new
        session. With `gateway.strict_keys` (AReaL's behaviour) the key is refused instead."""
        assert caller.key is not None and caller.session is not None
        if self.strict_keys:
            raise OpenAIError(401, "this session key's session has ended; start a new one")
        rebound = await self.sessions.rebind(caller.key)
        if rebound is None or rebound[0].status == "revoked":
            raise OpenAIError(401, "this session key was revoked")
        row, created = rebound
        return row, f"key reused after {caller.session.session_id} ended" if created else None

    async def session_for_rl(self, headers: Mapping[str, str], body_session: str | None) -> str:
        """The session a session route (/rl/set_reward, feedback, end) acts on."""
        named = headers.get("x-session-id") or body_session
        caller, session_id = await self.authorize(headers, "session_route", named)
        if caller.session is not None:
            return caller.session.session_id
        if not session_id:
            raise OpenAIError(
                400, "which session? use its key, X-Session-Id or session_id", param="session_id"
            )
        if await self.sessions.get(session_id) is None:
            raise OpenAIError(404, f"unknown session {session_id}", param="session_id")
        return session_id
