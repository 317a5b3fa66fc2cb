"""Agents' own config files as users keep them, before `claw-stream connect` edits them (the
unit lane checks what connect writes into them; the e2e lane has the real agents read it),
what connect adds to opencode's, and connect run on one of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def connect_file(agent: str, path: Path, *args: str) -> str:
    """`claw-stream connect AGENT --file PATH ARGS...` in this process; what it printed."""
    from click.testing import CliRunner

    from claw_stream.cli import main

    result = CliRunner().invoke(main, ["connect", agent, "--file", str(path), *args])
    assert result.exit_code == 0, result.output
    return result.output


OPENCLAW_CONFIG: dict[str, Any] = {
    "models": {
        "mode": "merge",
        "providers": {
            "anthropic": {"apiKey": "sk-ant-1", "models": []},
            "local": {
                "baseUrl": "http://127.0.0.1:11434/v1",
                "api": "openai-completions",
                "models": [{"id": "llama", "name": "Llama", "contextWindow": 128000}],
            },
        },
    },
    "agents": {
        "defaults": {
            "model": {"primary": "anthropic/claude-opus-4-6", "fallbacks": ["local/llama"]},
            "workspace": "~/work",
        }
    },
    "gateway": {"port": 18789},
}
OPENCODE_JSONC = """{
  "$schema": "https://opencode.ai/config.json",
  // my opencode
  "theme": "tokyonight",
  "model": "anthropic/claude-sonnet-4-5", // the usual
  "provider": {
    "ollama": {
      "npm": "@ai-sdk/openai-compatible",
      "options": { "baseURL": "http://127.0.0.1:11434/v1" },
      "models": { "llama3.2": {} },
    },
  },
  "tools": { "bash": true },
}"""
OPENCODE_OURS = {
    "npm": "@ai-sdk/openai-compatible",
    "name": "claw-stream",
    "options": {"baseURL": "http://127.0.0.1:8000/v1", "apiKey": "claw-key"},
    "models": {
        "smollm2-135m": {
            "name": "smollm2-135m via claw-stream",
            "limit": {"context": 8192, "output": 2048},
        }
    },
}
HERMES_CONFIG = """# Hermes Agent
model: anthropic/claude-opus-4.6
providers: {}
toolsets:
- hermes-cli
agent:
  max_turns: 60  # enough
"""
