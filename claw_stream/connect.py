"""`claw-stream connect AGENT`: our provider written into a coding agent's own config file.

Each agent keeps its settings in a file of its own; connecting one merges our entry into it
and leaves everything else as it was: other providers, keys, comments (TOML) and order.
Running it twice changes nothing the second time; a file that cannot be read is left
untouched with a one-line error; the file as it was before a change is kept beside it.

- Claude Code: `~/.claude/settings.json`, its `env` object (`ANTHROPIC_BASE_URL`, a key as
  `ANTHROPIC_AUTH_TOKEN`, the model for every role, no traffic to Anthropic's own hosts).
- Codex CLI: `$CODEX_HOME/config.toml` (default `~/.codex/`), a `[model_providers.claw-stream]`
  table with `wire_api = "responses"`, chosen as the default with the served model and its
  context window. Codex reads the key from the environment variable named by `env_key`.

Claude Code and Codex name their own sessions (`gateway/agents.py`), so they get a key of
the client kind, not a session key, which would hold every run in one session.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError

PROVIDER = "claw-stream"  # our provider's id in each agent's config
CODEX_KEY_ENV = "CLAW_STREAM_API_KEY"
BACKUP_SUFFIX = ".claw-stream.bak"


class ConfigError(Exception):
    """An agent's config file that cannot be read; the message is one line."""


@dataclass(frozen=True)
class Target:
    """What an agent needs to reach the gateway."""

    base_url: str  # the gateway's root, no /v1
    key: str
    model: str  # the name the gateway lists for the served model
    context: int | None  # its context window in tokens, where the gateway says


def claude_code(text: str, target: Target) -> str:
    """Claude Code's settings.json with our endpoint in its `env`."""
    try:
        settings = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise ConfigError(f"not valid JSON: {exc}") from None
    if not isinstance(settings, dict) or not isinstance(settings.get("env", {}), dict):
        raise ConfigError("expected a JSON object whose `env` is an object")
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


def codex(text: str, target: Target) -> str:
    """Codex's config.toml with our provider, chosen as the default."""
    try:
        doc = tomlkit.parse(text)
    except TOMLKitError as exc:
        raise ConfigError(f"not valid TOML: {exc}") from None
    doc["model"] = target.model
    doc["model_provider"] = PROVIDER
    if target.context is not None:
        doc["model_context_window"] = target.context
    providers = doc.get("model_providers")
    if providers is None:
        providers = tomlkit.table(is_super_table=True)
        doc["model_providers"] = providers
    elif not isinstance(providers, dict):
        raise ConfigError("`model_providers` is not a table")
    provider = tomlkit.table()
    provider["name"] = PROVIDER
    provider["base_url"] = f"{target.base_url}/v1"  # Codex posts {base_url}/responses
    provider["env_key"] = CODEX_KEY_ENV
    provider["wire_api"] = "responses"
    provider.add(tomlkit.nl())
    if providers.get(PROVIDER) != provider:
        providers[PROVIDER] = provider
    return tomlkit.dumps(doc)


@dataclass(frozen=True)
class Agent:
    name: str
    path: Callable[[], Path]  # where its config lives on this machine
    merge: Callable[[str, Target], str]
    then: Callable[[Target], str]  # what the user does next, in words


def _codex_home() -> Path:
    return Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex")


AGENTS = {
    "claude-code": Agent(
        "claude-code",
        lambda: Path.home() / ".claude" / "settings.json",
        claude_code,
        lambda t: "run `claude` as usual: it talks to the gateway",
    ),
    "codex": Agent(
        "codex",
        lambda: _codex_home() / "config.toml",
        codex,
        lambda t: f"export {CODEX_KEY_ENV}={t.key}, then run `codex` as usual",
    ),
}


@dataclass(frozen=True)
class Change:
    path: Path
    before: str
    after: str

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def diff(self) -> str:
        return "".join(
            difflib.unified_diff(
                self.before.splitlines(keepends=True),
                self.after.splitlines(keepends=True),
                f"{self.path} (now)",
                f"{self.path} (connected)",
            )
        )


def plan(agent: Agent, target: Target, path: Path | None = None) -> Change:
    """What connecting `agent` would change; ConfigError when its file cannot be read."""
    where = path or agent.path()
    before = where.read_text() if where.exists() else ""
    try:
        after = agent.merge(before, target)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc} (left untouched)") from None
    return Change(where, before, after)


def write(change: Change) -> Path | None:
    """Write a change, keeping the file as it was beside it; the backup's path, if any."""
    if not change.changed:
        return None
    change.path.parent.mkdir(parents=True, exist_ok=True)
    backup = None
    if change.path.exists():
        backup = change.path.with_name(change.path.name + BACKUP_SUFFIX)
        shutil.copy2(change.path, backup)
    partial = change.path.with_name(change.path.name + ".claw-stream.tmp")
    partial.write_text(change.after)
    partial.replace(change.path)  # whole or not at all
    return backup


def served_model(models: dict[str, Any]) -> tuple[str, int | None]:
    """The first model a `GET /v1/models` answer lists, and its context where it says."""
    data = models.get("data") or []
    if not data or not isinstance(data[0], dict) or not data[0].get("id"):
        raise ConfigError("the gateway lists no model (GET /v1/models)")
    context = data[0].get("max_model_len")
    return str(data[0]["id"]), context if isinstance(context, int) else None
