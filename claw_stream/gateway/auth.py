"""Who is calling, and which session a call acts on.

Credentials: the admin key, the client key (when one is set; otherwise any key passes as a
client), and per-session keys (stored as SHA-256 hashes in Postgres). A call names its session
by its session key, by the URL path (`/{session_id}/{group_id}/...`), by `X-Session-Id`, or by
`session_id` in the body.
"""

from __future__ import annotations

import hmac
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from claw_stream.dialect import OpenAIError
from claw_stream.gateway.sessions import SessionStore


@dataclass
class SessionCtx:
    session_id: str
    group_id: str | None
    turn_type: str
    done: bool
    convention: str


def check_id(value: str, name: str) -> None:
    if not 0 < len(value) <= 256 or not value.isprintable():
        raise OpenAIError(422, f"{name} must be 1-256 printable characters", param=name)


def bearer(headers: Mapping[str, str]) -> str | None:
    header = headers.get("authorization", "")
    return header[7:].strip() if header[:7].lower() == "bearer " else None


class Auth:
    def __init__(self, admin_key: str, client_key: str | None, sessions: SessionStore):
        self.admin_key = admin_key
        self.client_key = client_key
        self.sessions = sessions

    def is_admin(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token.encode(), self.admin_key.encode())

    def is_client(self, token: str | None) -> bool:
        if self.client_key is None:
            return True
        return token is not None and hmac.compare_digest(token.encode(), self.client_key.encode())

    def require_admin(self, headers: Mapping[str, str]) -> None:
        if not self.is_admin(bearer(headers)):
            raise OpenAIError(401, "admin key required (Authorization: Bearer <admin key>)")

    async def resolve(
        self,
        headers: Mapping[str, str],
        body: dict[str, Any],
        path_session: str | None,
        path_group: str | None,
    ) -> SessionCtx:
        """The session of a chat call; pops the session fields from `body`."""
        token = bearer(headers)
        body_session = body.pop("session_id", None)
        turn_type = headers.get("x-turn-type") or body.pop("turn_type", None) or "main"
        body.pop("turn_type", None)
        done_header = headers.get("x-session-done")
        done = (done_header or "").lower() in ("1", "true", "yes") or bool(
            body.pop("session_done", False)
        )
        if turn_type not in ("main", "side"):
            raise OpenAIError(422, "X-Turn-Type must be main or side", param="turn_type")
        if token and not self.is_admin(token) and not (self.client_key and self.is_client(token)):
            row = await self.sessions.by_key(token)
            if row is not None:
                if row.status != "active":
                    raise OpenAIError(401, "this session key's session has ended; start a new one")
                return SessionCtx(row.session_id, row.group_id, turn_type, done, "api_key")
            if self.client_key is not None or token.startswith("claw-sk-"):
                raise OpenAIError(401, "invalid API key")
        elif not self.is_client(token) and not self.is_admin(token):
            raise OpenAIError(401, "invalid API key")
        session_id = path_session or headers.get("x-session-id") or body_session
        convention = "path" if path_session else "header"
        if not session_id:
            session_id, done, convention = f"anon-{uuid.uuid4().hex}", True, "none"
        check_id(session_id, "session_id")
        if path_group is not None:
            check_id(path_group, "group_id")
        return SessionCtx(
            session_id, path_group or headers.get("x-group-id"), turn_type, done, convention
        )

    async def session_for_rl(self, headers: Mapping[str, str], body_session: str | None) -> str:
        """The session an /rl call acts on."""
        token = bearer(headers)
        if token and not self.is_admin(token) and not (self.client_key and self.is_client(token)):
            row = await self.sessions.by_key(token)
            if row is None:
                raise OpenAIError(401, "invalid API key")
            return row.session_id
        if not (self.is_client(token) or self.is_admin(token)):
            raise OpenAIError(401, "invalid API key")
        session_id = headers.get("x-session-id") or body_session
        if not session_id:
            raise OpenAIError(
                400, "which session? use its key, X-Session-Id or session_id", param="session_id"
            )
        if await self.sessions.get(session_id) is None:
            raise OpenAIError(404, f"unknown session {session_id}", param="session_id")
        return session_id
