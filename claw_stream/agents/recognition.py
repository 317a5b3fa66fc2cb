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
- opencode (`User-Agent: opencode/...`): its session id (`ses_...`) as `x-session-affinity`
  and `x-session-id` (that header is its own here, not the gateway's convention); its title
  and summary calls carry no tools: side requests.
- Gemini CLI (`User-Agent: GeminiCLI[-<client>]/<version>/<model> (...)`): names no session
  in its calls (its session id stays in its own files): the gateway infers the session from
  the main line. Its utility calls (next-speaker check, compression, loop detection, edit
  correction) carry no tools: side requests.
- aider: names no session (`claw-stream connect aider` gives it a session key); known by its
  system prompts (`Act as an expert ...` for its coders' turns); its chat summaries and commit
  messages, with prompts of their own, are side requests.
- Hermes Agent: names no session on the wire, but resends the whole conversation (the gateway
  joins its calls by their main line); known by its system prompt (`You are Hermes Agent`);
  its session titles, with a prompt of their own, are side requests.

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
GEMINI_CLI_AGENT = "GeminiCLI"  # how its User-Agent begins (`GeminiCLI-tui/0.61.0/...`)
OPENCODE_AGENT = "opencode/"  # how its User-Agent begins (`opencode/1.18.33 ai-sdk/...`)
HERMES_SYSTEM = "You are Hermes Agent"  # how its agent's system prompt begins
HERMES_TITLE = "Generate a short, descriptive title (3-7 words) for a conversation"
# aider's system prompts: its coders' turns, and its side calls (chat summary, commit message)
AIDER_SYSTEM = ("Act as an expert ", "You are an expert on the AI coding tool called Aider")
AIDER_SIDE = (
    "*Briefly* summarize this partial conversation about programming.",
    "You are an expert software engineer that generates concise, one-line Git commit messages",
)
_OPENCLAW_RUNTIME = re.compile(r"Runtime: agent=[^|\n]*\| session=[^|\n]*\| sessionId=([^\s|]+)")


@dataclass(frozen=True)
class AgentCall:
    """What a call's agent said of it: who it is, its session, whether it is a side request."""

    agent: str
    session_id: str | None = None
    side: bool = False
    # its X-Session-Id is its own session id, sent unasked (opencode's): a hint like the
    # others, not the gateway's header convention, which would outrank a session key
    own_session_header: bool = False


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


def opencode(headers: Mapping[str, str], body: Mapping[str, Any]) -> AgentCall | None:
    """opencode's session, from the id it sends as `x-session-affinity` and `x-session-id`;
    its calls without tools (session titles, summaries) as side requests; None: not opencode."""
    if not headers.get("user-agent", "").startswith(OPENCODE_AGENT):
        return None
    session = headers.get("x-session-affinity") or headers.get("x-session-id")
    own = session is not None and headers.get("x-session-id") == session
    side = not body.get("tools")  # its agents' main loop always sends their tools
    return AgentCall("opencode", _named("opencode", session), side, own_session_header=own)


def gemini_cli(headers: Mapping[str, str], body: Mapping[str, Any]) -> AgentCall | None:
    """Gemini CLI: no session of its own on the wire; its calls without tools (`BaseLlmClient`'s
    utility calls) as side requests; None: not Gemini CLI."""
    if not headers.get("user-agent", "").startswith(GEMINI_CLI_AGENT):
        return None
    return AgentCall("gemini", None, side=not body.get("tools"))


def aider(body: Mapping[str, Any]) -> AgentCall | None:
    """aider, by the system prompt it begins its calls with; its chat summaries and commit
    messages as side requests; None: not aider."""
    messages = body.get("messages")
    system = _system_text(messages) if isinstance(messages, list) else ""
    if system.startswith(AIDER_SIDE):
        return AgentCall("aider", None, side=True)
    if system.startswith(AIDER_SYSTEM):
        return AgentCall("aider", None)
    return None


def hermes(body: Mapping[str, Any]) -> AgentCall | None:
    """Hermes Agent, by its system prompt; its title calls as side requests; None: not it."""
    messages = body.get("messages")
    system = _system_text(messages) if isinstance(messages, list) else ""
    if system.startswith(HERMES_SYSTEM):
        return AgentCall("hermes", None)
    if system.startswith(HERMES_TITLE):
        return AgentCall("hermes", None, side=True)
    return None


def agent_call(headers: Mapping[str, str], body: Mapping[str, Any]) -> AgentCall:
    """What the call's agent says of it; `NO_AGENT` when it is none of those above."""
    return (
        claude_code(headers, body)
        or codex(headers)
        or opencode(headers, body)  # before OpenClaw: it sends x-session-affinity too
        or openclaw(headers, body)
        or gemini_cli(headers, body)
        or aider(body)
        or hermes(body)
        or NO_AGENT
    )
