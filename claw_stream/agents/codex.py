"""Codex CLI's config: `$CODEX_HOME/config.toml` (default `~/.codex/`), a
`[model_providers.claw-stream]` table with `wire_api = "responses"`, chosen as the default with
the served model and its context window. Codex reads the key from the environment variable
named by `env_key`."""

from __future__ import annotations

import os
from pathlib import Path

import tomlkit
from tomlkit.exceptions import TOMLKitError

from claw_stream.agents.target import PROVIDER, AgentConfigFileError, Target

CODEX_KEY_ENV = "CLAW_STREAM_API_KEY"


def config_path() -> Path:
    return Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex") / "config.toml"


def merge(text: str, target: Target) -> str:
    """Codex's config.toml with our provider, chosen as the default."""
    try:
        doc = tomlkit.parse(text)
    except TOMLKitError as exc:
        raise AgentConfigFileError(f"not valid TOML: {exc}") from None
    doc["model"] = target.model
    doc["model_provider"] = PROVIDER
    if target.context is not None:
        doc["model_context_window"] = target.context
    providers = doc.get("model_providers")
    if providers is None:
        providers = tomlkit.table(is_super_table=True)
        doc["model_providers"] = providers
    elif not isinstance(providers, dict):
        raise AgentConfigFileError("`model_providers` is not a table")
    provider = tomlkit.table()
    provider["name"] = PROVIDER
    provider["base_url"] = f"{target.base_url}/v1"  # Codex posts {base_url}/responses
    provider["env_key"] = CODEX_KEY_ENV
    provider["wire_api"] = "responses"
    provider.add(tomlkit.nl())
    if providers.get(PROVIDER) != provider:
        providers[PROVIDER] = provider
    return tomlkit.dumps(doc)
