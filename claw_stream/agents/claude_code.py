"""Claude Code's config: `~/.claude/settings.json`, its `env` object (`ANTHROPIC_BASE_URL`, a
key as `ANTHROPIC_AUTH_TOKEN`, the model for every role, no traffic to Anthropic's own
hosts)."""

from __future__ import annotations

import json
from pathlib import Path

from claw_stream.agents.target import AgentConfigFileError, Target


def config_path() -> Path:
    return Path.home() / ".claude" / "settings.json"


def merge(text: str, target: Target) -> str:
    """Claude Code's settings.json with our endpoint in its `env`."""
    try:
        settings = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise AgentConfigFileError(f"not valid JSON: {exc}") from None
    if not isinstance(settings, dict) or not isinstance(settings.get("env", {}), dict):
        raise AgentConfigFileError("expected a JSON object whose `env` is an object")
    env = settings.setdefault("env", {})
    env.update(
        {
            "ANTHROPIC_BASE_URL": target.base_url,
            "ANTHROPIC_AUTH_TOKEN": target.key,
            # one model for every role: its side queries (titles, summaries) ask for the
            # small model, and a name the gateway does not serve would be refused when strict
            "ANTHROPIC_MODEL": target.model,
            "ANTHROPIC_SMALL_FAST_MODEL": target.model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": target.model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": target.model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": target.model,
            # telemetry and update checks go to Anthropic's hosts, not the base URL
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
    )
    return json.dumps(settings, indent=2, ensure_ascii=False) + "\n"
