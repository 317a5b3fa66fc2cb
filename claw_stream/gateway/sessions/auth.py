"""Who is calling (`Auth.caller`), and the session a call acts on, by the matrix in `authz.py`.

Credentials come as `Authorization: Bearer <key>`, `x-api-key` as Anthropic clients send it, or
`x-goog-api-key` as Google's do (the Gemini door takes its `?key=` there too).
"""

from __future__ import annotations

import hmac
import logging
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from claw_stream.agents.recognition import NO_AGENT, AgentCall
from claw_stream.dialect import OpenAIError
from claw_stream.gateway.sessions.authz import Credential, RouteKind, decide
from claw_stream.gateway.sessions.main_lines import MainLines
from claw_stream.gateway.sessions.store import SessionRow, SessionStore
from claw_stream.tenants import TENANT_HEADER, TenantSettings, check_tenant

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Caller:
    credential: Credential
    key: str | None  # the key it presented
    session: SessionRow | None = None  # a session key's session
    tenant: str | None = None  # whose calls these are (tenants.py)
    bound: bool = False  # the key fixes the tenant: naming another is refused


@dataclass
class SessionCtx:
    session_id: str
    group_id: str | None
    turn_type: str
    done: bool
    convention: str
    new_episode: str | None = None  # why this call starts a session its key did not have
    train: bool = True  # False: the call asked not to be trained, or its key is never trained
    tenant: str | None = None  # whose agent the call serves (tenants.py)


def check_id(value: str, name: str) -> None:
    if not 0 < len(value) <= 256 or not value.isprintable():
        raise OpenAIError(422, f"{name} must be 1-256 printable characters", param=name)


def session_names(
    headers: Mapping[str, str], body_session: object = None, path_session: str | None = None
) -> dict[str, str | None]:
    """Where a request names a session, for `authz.decide`: URL path, header, body field."""
    if body_session is not None and not isinstance(body_session, str):
        raise OpenAIError(422, "session_id must be a string", param="session_id")
    return {
        "the URL path": path_session,
        "X-Session-Id": headers.get("x-session-id"),
        "the body's session_id": body_session,
    }


def _train_flag(header: str | None, body: object) -> bool:
    """X-Claw-Train or the body's `train`: False when either says false."""
    if body is not None and not isinstance(body, bool):
        raise OpenAIError(422, "train must be true or false", param="train")
    if header is None:
        return body is not False
    value = header.strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise OpenAIError(422, "X-Claw-Train must be true or false", param="X-Claw-Train")
    return value in ("true", "1", "yes") and body is not False


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key of a request: a bearer token, Anthropic's `x-api-key` or Google's
    `x-goog-api-key`."""
    header = headers.get("authorization", "")
    if header[:7].lower() == "bearer ":
        return header[7:].strip() or None
    return headers.get("x-api-key") or headers.get("x-goog-api-key") or None


class Auth:
    def __init__(
        self,
        admin_key: str,
        client_key: str | None,
        sessions: SessionStore,
        *,
        strict_keys: bool = False,
        lines: MainLines | None = None,
        untrained_keys: Collection[str] = (),
        tenants: TenantSettings | None = None,
        policy: str = "policy",
    ):
        self.untrained_keys = frozenset(untrained_keys)
        self.tenants = tenants or TenantSettings()
        self.policy = policy
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
        if key is not None and (tenant := self.tenants.keys.get(key)) is not None:
            return Caller("client", key, tenant=tenant, bound=True)
        if key is not None:
            row = await self.sessions.by_key(key)
            if row is not None:
                if row.status == "revoked":
                    raise OpenAIError(401, "this session key was revoked")
                return Caller("session", key, row, tenant=row.tenant, bound=True)
            if self.client_key is not None or key.startswith("claw-sk-"):
                raise OpenAIError(401, "invalid API key")
        if self.client_key is None:
            return Caller("client", key)
        return Caller("none", key)

    async def authorize(
        self, headers: Mapping[str, str], kind: RouteKind, named: Mapping[str, str | None]
    ) -> tuple[Caller, str | None]:
        """The caller and the session the request acts on (`authz.decide`): the named session,
        or a session key's own one. `named` maps each place the request names a session in
        (`session_names`) to the name found there."""
        caller = await self.caller(headers)
        own = caller.session.session_id if caller.session is not None else None
        return caller, decide(kind, caller.credential, own, named)

    def tenant(self, caller: Caller, headers: Mapping[str, str]) -> str | None:
        """The tenant a call is made for: its key's, or (`tenants.from_agent_id`) the one its
        X-Agent-Id names. A key bound to a tenant cannot name another: 403."""
        asked = headers.get(TENANT_HEADER) if self.tenants.from_agent_id else None
        if caller.bound:
            if asked is not None and asked != caller.tenant:
                raise OpenAIError(
                    403,
                    f"this key calls for tenant {caller.tenant or '(none)'}; "
                    f"it cannot call for tenant {asked}",
                    param="X-Agent-Id",
                )
            return caller.tenant
        if asked is None:
            return None
        try:
            return check_tenant(asked, self.policy)
        except ValueError as exc:
            raise OpenAIError(422, f"X-Agent-Id: {exc}", param="X-Agent-Id") from None

    async def resolve(
        self,
        headers: Mapping[str, str],
        body: dict[str, Any],
        path_session: str | None,
        path_group: str | None,
        agent: AgentCall = NO_AGENT,
    ) -> SessionCtx:
        """The session of a model call; pops the session fields from `body`. What the call's
        agent says of it (`agents.py`) counts where nothing stronger names the session or the
        turn's kind."""
        body_session = body.pop("session_id", None)
        turn_type = (
            headers.get("x-turn-type")
            or body.pop("turn_type", None)
            or ("side" if agent.side else "main")
        )
        body.pop("turn_type", None)
        done_header = headers.get("x-session-done")
        done = (done_header or "").lower() in ("1", "true", "yes") or bool(
            body.pop("session_done", False)
        )
        if turn_type not in ("main", "side"):
            raise OpenAIError(422, "X-Turn-Type must be main or side", param="turn_type")
        train = _train_flag(headers.get("x-claw-train"), body.pop("train", None))
        named = session_names(headers, body_session, path_session)
        if agent.own_session_header:  # the agent's own id, a hint like the others below
            named["X-Session-Id"] = None
        caller, session_id = await self.authorize(headers, "model_call", named)
        train = train and caller.key not in self.untrained_keys
        tenant = self.tenant(caller, headers)
        if caller.session is not None:
            row, new_episode = caller.session, None
            if row.status != "active":
                row, new_episode = await self._next_episode(caller)
            return SessionCtx(
                row.session_id,
                row.group_id,
                turn_type,
                done,
                "api_key",
                new_episode,
                train,
                tenant,
            )
        convention = "path" if path_session else "header"
        if not session_id and agent.session_id:
            session_id, convention = agent.session_id, "agent"
        if not session_id:
            session_id, convention = await self._by_main_line(body), "prefix"
        check_id(session_id, "session_id")
        if path_group is not None:
            check_id(path_group, "group_id")
        return SessionCtx(
            session_id,
            path_group or headers.get("x-group-id"),
            turn_type,
            done,
            convention,
            train=train,
            tenant=tenant,
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
        named = session_names(headers, body_session)
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
