"""The agents by name: those `claw-stream connect` sets up, and those the gateway recognises by
their own session ids. It names their sessions `<agent>-<their id>` (`recognition.py`); the
console shows the agent from it. Imports nothing: the CLI's --help reads it."""

from __future__ import annotations

CONNECTABLE = (
    "claude-code",
    "codex",
    "openclaw",
    "zeroclaw",
    "opencode",
    "gemini",
    "aider",
    "hermes",
)
RECOGNISED = ("claude-code", "codex", "openclaw", "opencode")


def agent_of(session_id: str) -> str:
    return next((a for a in RECOGNISED if session_id.startswith(f"{a}-")), "")
