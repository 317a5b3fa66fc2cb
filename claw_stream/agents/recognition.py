"""Which agent sent a call, and what it says of its session in its own headers and body.

Coding agents name their conversation without being asked (recorded in `tests/fixtures/`):

- Claude Code: `X-Claude-Code-Session-Id`, and `metadata.user_id` (a JSON string with
  `session_id`; older versions wrote `user_<hash>_account_<uuid>_session_<uuid>`). A request
  with no tools is one of its side queries.
- Codex CLI: `session-id` and `x-codex-turn-metadata` (JSON: `session_id`, `turn_id`,
  `request_kind`, the kind of request: the user's turn, or a side request such as a
  compaction).
- OpenClaw: `x-session-affinity` with `compat.sendSessionAffinityHeaders`; without it, the
  runtime line it writes into the first user message of every main request, compacted or not
  (`Runtime: agent=main | session=agent:main:explicit:s1 | sessionId=s1 | ...`). Its
  compaction calls carry neither, no tools, and its summariser's own system prompt: side
  requests, which never open a main line of their own.

Such a name is a hint, weaker than the gateway's own conventions: it names the session only
when neither a session key, the URL path, `X-Session-Id` nor the body's `session_id` does, so
an agent's header never moves a call out of the session its key is bound to. It is prefixed by
the agent (`claude-code-<id>`), so two agents' ids never meet in one session.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

# Codex's request kinds: `turn` is the user's turn (and each follow-up after its tool calls);
# `compaction`, `memory` and `prewarm` are side requests, and so is a sub-agent's `turn`
CODEX_TURN_KIND = "turn"
_OLD_USER_ID = re.compile(r"_session_([0-9A-Za-z-]{8,128})$")
OPENCLAW_SYSTEM = "<!-- openclaw:"  # how its agent's system prompt begins
OPENCLAW_SUMMARISER = "You are a context summarization assistant."
_OPENCLAW_RUNTIME = re.compile(r"Runtime: agent=[^|\n]*\| session=[^|\n]*\| sessionId=([^\s|]+)")


@dataclass(frozen=True)
class AgentCall:
    """What a call's agent said of it: who it is, its session, whether it is a side request."""

    agent: str
    session_id: str | None = None
    side: bool = False


NO_AGENT = AgentCall("")


def _json_object(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _named(agent: str, session: object) -> str | None:
    if not isinstance(session, str) or not session.strip() or len(session) > 200:
        return None
    return f"{agent}-{session.strip()}"


def claude_code(headers: Mapping[str, str], body: Mapping[str, Any]) -> AgentCall | None:
    """Claude Code's session, from its header or `metadata.user_id`; None: not Claude Code."""
    session: object = headers.get("x-claude-code-session-id")
    if session is None:
        user_id = (body.get("metadata") or {}).get("user_id")
        if isinstance(user_id, str):
            session = _json_object(user_id).get("session_id")
            if session is None and (old := _OLD_USER_ID.search(user_id)):
                session = old.group(1)
    if session is None:
        return None
    # its main loop always sends its whole tool list; its side queries (a session title, a
    # tool-use summary, a quota probe of max_tokens 1) go to the small model with no tools
    return AgentCall("claude-code", _named("claude-code", session), side=not body.get("tools"))


def codex(headers: Mapping[str, str]) -> AgentCall | None:
    """Codex's session and request kind; None: not Codex."""
    metadata = _json_object(headers.get("x-codex-turn-metadata"))
    session = headers.get("session-id") or metadata.get("session_id")
    if session is None and not metadata:
        return None
    kind = metadata.get("request_kind", CODEX_TURN_KIND)
    subagent = headers.get("x-openai-subagent") or metadata.get("subagent_kind")
    side = kind != CODEX_TURN_KIND or bool(subagent)
    return AgentCall("codex", _named("codex", session), side)


def _texts(content: object) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        ]
    return []


def _system_text(messages: list[Any]) -> str:
    first = messages[0] if messages and isinstance(messages[0], dict) else {}
    return "".join(_texts(first.get("content"))) if first.get("role") == "system" else ""


def _runtime_session(messages: list[Any]) -> str | None:
    """The sessionId of OpenClaw's runtime line, in the first user messages that hold one."""
    for message in messages[1:4]:  # after a compaction, the summary's message holds it
        if isinstance(message, dict) and message.get("role") == "user":
            for text in _texts(message.get("content")):
                if match := _OPENCLAW_RUNTIME.search(text):
                    return match.group(1)
    return None


def openclaw(headers: Mapping[str, str], body: Mapping[str, Any]) -> AgentCall | None:
    """OpenClaw's session, by its affinity header or its runtime line; its compaction calls
    as side requests; None: not OpenClaw."""
    if session := headers.get("x-session-affinity"):
        return AgentCall("openclaw", _named("openclaw", session))
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    system = _system_text(messages)
    if system.startswith(OPENCLAW_SUMMARISER) and not body.get("tools"):
        return AgentCall("openclaw", None, side=True)
    if system.startswith(OPENCLAW_SYSTEM) and (session := _runtime_session(messages)):
        return AgentCall("openclaw", _named("openclaw", session))
    return None


def agent_call(headers: Mapping[str, str], body: Mapping[str, Any]) -> AgentCall:
    """What the call's agent says of it; `NO_AGENT` when it is none of those above."""
    return claude_code(headers, body) or codex(headers) or openclaw(headers, body) or NO_AGENT
