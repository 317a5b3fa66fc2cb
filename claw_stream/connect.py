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
- OpenClaw: `$OPENCLAW_CONFIG_PATH`, else `$OPENCLAW_STATE_DIR/openclaw.json`, else
  `~/.openclaw/openclaw.json` (`$OPENCLAW_HOME` for `~`). JSON5: read with `json5`, written
  back as standard JSON (itself JSON5) in the file's own indentation and key order; comments
  in it are not kept (the backup keeps them). `models.providers.claw-stream` (`api:
  "openai-completions"`, `baseUrl` with /v1, `apiKey`) with the served model, its
  `contextWindow` (without one OpenClaw assumes 200,000 tokens) and `maxTokens`, and
  `compat.sendSessionAffinityHeaders: true` (a model's `compat`; without it OpenClaw sends no
  session id to a custom provider), chosen as `agents.defaults.model` (its `primary` where it
  is an object, so `fallbacks` stay). The id is not `openai`, which OpenClaw routes as OpenAI's
  own. Below 32,768 tokens of context its small-model profile is written too (`SMALL_PROFILE`:
  its prompt of ~60 KB and 12 tools, 12.7k tokens and 15k after two tool calls, becomes
  ~10.6 KB and 3 tools, which fits 8,192); with more context, the full one: a small profile
  this command wrote is taken out again, anything else left as the user set it.
- ZeroClaw: `$ZEROCLAW_CONFIG_DIR/config.toml` (default `~/.zeroclaw/`), its current schema
  (`schema_version = 3`): `[providers.models.custom.claw_stream]` (`uri` with /v1, `api_key`,
  `model`, `context_window`, `max_tokens`) and an agent of our own, `[agents.claw_stream]`,
  that uses it (`zeroclaw agent -a claw_stream`; ZeroClaw has no default agent, and its
  aliases take no hyphen), gated by `[risk_profiles.default]` (created empty, ZeroClaw's own
  defaults, where missing). A file in its old schema (no `schema_version = 3`: top-level
  `default_provider`, `api_key`, `default_model` and `[model_providers.X]`) is read and left
  untouched: ZeroClaw migrates it in memory only, and a schema-3 table written into it would
  be mangled by that migration (a hand-written `[providers]` loses its `models` to the
  migrated ones), so the error says to run `zeroclaw config migrate` first.

Which key. Claude Code and Codex name their own sessions (`gateway/sessions/agents.py`), and so does
OpenClaw once `sendSessionAffinityHeaders` is on (`session_id`, `x-client-request-id`,
`x-session-affinity`: the session is `openclaw-<id>`): they get a key of the client kind, not
a session key, which would hold every run in one session whatever their headers say (a
session key's session always wins). ZeroClaw names no session: it gets a fresh session key
(`/rl/start_session`), which ties its calls together and lets a script reward them by key.
Without `--key`, a key already written in our entry is kept, so a second run changes nothing.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import json5
import tomlkit
from tomlkit.exceptions import TOMLKitError

PROVIDER = "claw-stream"  # our provider's id in each agent's config
CODEX_KEY_ENV = "CLAW_STREAM_API_KEY"
BACKUP_SUFFIX = ".claw-stream.bak"
# OpenClaw's small-model profile, below SMALL_CONTEXT tokens: (object path, key, value)
SMALL_CONTEXT = 32_768
SMALL_PROFILE: tuple[tuple[tuple[str, ...], str, object], ...] = (
    (("tools",), "profile", "minimal"),  # 3 tools instead of 12
    (("agents", "defaults"), "contextInjection", "never"),  # no workspace files in the prompt
    (("agents", "defaults"), "skipBootstrap", True),  # nor created to be read
)
ZEROCLAW_ALIAS = "claw_stream"  # ZeroClaw's aliases: lowercase letters, digits, single `_`
ZEROCLAW_SCHEMA = 3
ZEROCLAW_RISK_PROFILE = "default"


class ConfigError(Exception):
    """An agent's config file that cannot be read; the message is one line."""


@dataclass(frozen=True)
class Target:
    """What an agent needs to reach the gateway."""

    base_url: str  # the gateway's root, no /v1
    key: str
    model: str  # the name the gateway lists for the served model
    context: int | None  # its context window in tokens, where the gateway says
    max_tokens: int | None = None  # the longest answer to ask for; None: a share of `context`

    @property
    def answer_tokens(self) -> int | None:
        """The answer limit an agent should ask for: `max_tokens`, else a quarter of the
        context, at most 8,192 (the gateway lowers a larger ask to the room a prompt leaves)."""
        if self.max_tokens is not None:
            return self.max_tokens
        return None if self.context is None else max(1, min(8192, self.context // 4))

    @property
    def small(self) -> bool:
        """Whether the model's context is below what an agent's full prompt needs."""
        return self.context is not None and self.context < SMALL_CONTEXT


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _object(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """`parent[key]`, an object, created empty where missing."""
    value = parent.setdefault(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"`{where}` is not an object")
    return value


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


# -- OpenClaw ---------------------------------------------------------------------------------


def _openclaw_config(text: str) -> dict[str, Any]:
    try:
        config = json5.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise ConfigError(f"not valid JSON5: {_one_line(exc)}") from None
    if not isinstance(config, dict):
        raise ConfigError("expected a JSON5 object")
    return config


def _openclaw_provider(config: dict[str, Any]) -> dict[str, Any] | None:
    provider = ((config.get("models") or {}).get("providers") or {}).get(PROVIDER)
    return provider if isinstance(provider, dict) else None


def _indent(text: str) -> str | int:
    """The indentation a JSON file already uses (2 where it says nothing)."""
    found = re.search(r"^([ \t]+)\S", text, re.MULTILINE)
    if found is None:
        return 2
    unit = found.group(1)
    return unit if unit.startswith("\t") else len(unit)


def _profile(config: dict[str, Any], small: bool) -> None:
    """OpenClaw's small-model profile written; or, for the full one, taken out where it is
    all there as this command writes it (anything else is the user's own choice)."""
    if small:
        for path, key, value in SMALL_PROFILE:
            parent = config
            for i, name in enumerate(path):
                parent = _object(parent, name, ".".join(path[: i + 1]))
            parent[key] = value
        return
    found = []
    for path, key, value in SMALL_PROFILE:
        node: Any = config
        for name in path:
            node = node.get(name) if isinstance(node, dict) else None
        if not isinstance(node, dict) or node.get(key) != value:
            return
        found.append((node, key))
    for node, key in found:
        del node[key]
    if config.get("tools") == {}:
        del config["tools"]


def openclaw(text: str, target: Target) -> str:
    """OpenClaw's openclaw.json with our provider, its model chosen as the agents' default."""
    config = _openclaw_config(text)
    before = copy.deepcopy(config)
    providers = _object(_object(config, "models", "models"), "providers", "models.providers")
    provider = _object(providers, PROVIDER, f"models.providers.{PROVIDER}")
    provider.update(
        {
            "baseUrl": f"{target.base_url}/v1",  # it posts {baseUrl}/chat/completions
            "apiKey": target.key,
            "api": "openai-completions",
        }
    )
    models = provider.get("models")
    same = [m for m in models if isinstance(m, dict)] if isinstance(models, list) else []
    model: dict[str, Any] = next((m for m in same if m.get("id") == target.model), {})
    model["id"] = target.model
    model.setdefault("name", f"{target.model} via claw-stream")
    if target.context is not None:
        model["contextWindow"] = target.context
    if target.answer_tokens is not None:
        model["maxTokens"] = target.answer_tokens
    compat = _object(model, "compat", f"models.providers.{PROVIDER}.models[].compat")
    compat["sendSessionAffinityHeaders"] = True  # its session id, as x-session-affinity
    provider["models"] = [model]  # the gateway serves one model
    defaults = _object(_object(config, "agents", "agents"), "defaults", "agents.defaults")
    ref = f"{PROVIDER}/{target.model}"
    chosen = defaults.get("model")
    if isinstance(chosen, dict):
        chosen["primary"] = ref  # its fallbacks stay
    elif isinstance(chosen, str):
        defaults["model"] = ref
    else:
        defaults["model"] = {"primary": ref}
    _profile(config, target.small)
    if config == before:
        return text  # nothing to change: the file as it is, comments and all
    return json.dumps(config, indent=_indent(text), ensure_ascii=False) + "\n"


def openclaw_key(text: str) -> str | None:
    provider = _openclaw_provider(_openclaw_config(text))
    key = provider.get("apiKey") if provider else None
    return key if isinstance(key, str) and key else None


def openclaw_notes(before: str, after: str, target: Target) -> list[str]:
    notes = []
    if target.small:
        notes.append(
            f"the model's context ({target.context:,} tokens) is below {SMALL_CONTEXT:,}: "
            'OpenClaw\'s small-model profile (tools.profile "minimal", agents.defaults.'
            'contextInjection "never", skipBootstrap): its request is ~10.6 KB with 3 tools '
            "instead of ~60 KB with 12 (~12.7k tokens)"
        )
    elif target.context is None:
        notes.append(
            "the gateway did not say the model's context: OpenClaw assumes 200,000 tokens; "
            "its full profile"
        )
    else:
        notes.append(
            f"the model's context ({target.context:,} tokens) holds OpenClaw's full prompt: "
            "its full profile (all its tools and workspace files)"
        )
    if before.strip() and after != before:
        try:
            json.loads(before)
        except ValueError:
            notes.append(
                "the file was JSON5 and is written back as plain JSON (valid JSON5): its "
                "comments are not kept, the backup has them"
            )
    return notes


# -- ZeroClaw ---------------------------------------------------------------------------------


def _zeroclaw_doc(text: str) -> tomlkit.TOMLDocument:
    """ZeroClaw's config in its current schema; ConfigError naming the way out otherwise."""
    try:
        doc = tomlkit.parse(text)
    except TOMLKitError as exc:
        raise ConfigError(f"not valid TOML: {_one_line(exc)}") from None
    version = doc.get("schema_version")
    if version is None and not doc:
        doc.add("schema_version", ZEROCLAW_SCHEMA)  # a new file
    elif version is None or (isinstance(version, int) and version < ZEROCLAW_SCHEMA):
        old = [f"[model_providers.{name}]" for name in doc.get("model_providers") or {}]
        old += [k for k in ("default_provider", "default_model", "api_key") if k in doc]
        seen = f": {', '.join(old)}" if old else ""
        raise ConfigError(
            f"ZeroClaw's old config schema (schema_version {version or 1}{seen}), which "
            "ZeroClaw migrates in memory only: run `zeroclaw config migrate`, then connect again"
        )
    elif version != ZEROCLAW_SCHEMA:
        raise ConfigError(
            f"schema_version {version}: this connect knows ZeroClaw's {ZEROCLAW_SCHEMA}"
        )
    return doc


def _table(parent: Any, key: str, where: str) -> Any:
    """`parent[key]`, a table: where missing, a super table (no header of its own)."""
    if key not in parent:
        parent[key] = tomlkit.table(is_super_table=True)
    value = parent[key]
    if not isinstance(value, dict):  # a table, or tomlkit's proxy of one split in the file
        raise ConfigError(f"`{where}` is not a table")
    return value


def _entry(parent: Any, key: str, where: str, values: dict[str, object]) -> Any:
    """`parent[key]`, a table holding `values`: each set where it differs, so an unchanged
    line keeps its comment; created with a blank line after it."""
    if key not in parent:
        table = tomlkit.table()
        for name, value in values.items():
            table[name] = value
        table.add(tomlkit.nl())
        parent[key] = table
        return table
    table = parent[key]
    if not isinstance(table, dict):
        raise ConfigError(f"`{where}` is not a table")
    for name, value in values.items():
        if table.get(name) != value:
            table[name] = value
    return table


def zeroclaw(text: str, target: Target) -> str:
    """ZeroClaw's config.toml with our provider and an agent of our own that uses it."""
    doc = _zeroclaw_doc(text)
    models = _table(_table(doc, "providers", "providers"), "models", "providers.models")
    custom = _table(models, "custom", "providers.models.custom")
    values: dict[str, object] = {
        "uri": f"{target.base_url}/v1",  # it posts {uri}/chat/completions
        "api_key": target.key,
        "model": target.model,
    }
    if target.context is not None:
        values["context_window"] = target.context
    if target.answer_tokens is not None:
        values["max_tokens"] = target.answer_tokens
    _entry(custom, ZEROCLAW_ALIAS, f"providers.models.custom.{ZEROCLAW_ALIAS}", values)
    agents = _table(doc, "agents", "agents")
    ours = agents.get(ZEROCLAW_ALIAS)
    values = {"model_provider": f"custom.{ZEROCLAW_ALIAS}"}
    if not (isinstance(ours, dict) and ours.get("risk_profile")):  # an enabled agent needs one
        values["risk_profile"] = ZEROCLAW_RISK_PROFILE
    agent = _entry(agents, ZEROCLAW_ALIAS, f"agents.{ZEROCLAW_ALIAS}", values)
    if agent["risk_profile"] == ZEROCLAW_RISK_PROFILE:
        profiles = _table(doc, "risk_profiles", "risk_profiles")
        if ZEROCLAW_RISK_PROFILE not in profiles:  # empty: ZeroClaw's safety-first defaults
            _entry(profiles, ZEROCLAW_RISK_PROFILE, "", {})
    return tomlkit.dumps(doc)


def zeroclaw_key(text: str) -> str | None:
    doc = _zeroclaw_doc(text)
    entry = ((doc.get("providers") or {}).get("models") or {}).get("custom") or {}
    key = (entry.get(ZEROCLAW_ALIAS) or {}).get("api_key")
    return str(key) if isinstance(key, str) and key else None


# -- the agents -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Agent:
    name: str
    path: Callable[[], Path]  # where its config lives on this machine
    merge: Callable[[str, Target], str]
    then: Callable[[Target], str]  # what the user does next, in words
    session_key: bool = False  # it names no session of its own: give it a fresh session key
    stored_key: Callable[[str], str | None] | None = None  # the key our entry already has
    notes: Callable[[str, str, Target], list[str]] | None = None  # (before, after, target)


def _codex_home() -> Path:
    return Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex")


def _openclaw_path() -> Path:
    if path := os.environ.get("OPENCLAW_CONFIG_PATH", "").strip():
        return Path(path).expanduser()
    if state := os.environ.get("OPENCLAW_STATE_DIR", "").strip():
        return Path(state).expanduser() / "openclaw.json"
    home = os.environ.get("OPENCLAW_HOME", "").strip()
    return (Path(home).expanduser() if home else Path.home()) / ".openclaw" / "openclaw.json"


def _zeroclaw_path() -> Path:
    if folder := os.environ.get("ZEROCLAW_CONFIG_DIR", "").strip():
        return Path(folder).expanduser() / "config.toml"
    return Path.home() / ".zeroclaw" / "config.toml"


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
    "openclaw": Agent(
        "openclaw",
        _openclaw_path,
        openclaw,
        lambda t: f"run `openclaw` as usual: its default model is {PROVIDER}/{t.model}",
        stored_key=openclaw_key,
        notes=openclaw_notes,
    ),
    "zeroclaw": Agent(
        "zeroclaw",
        _zeroclaw_path,
        zeroclaw,
        lambda t: (
            f"run `zeroclaw agent -a {ZEROCLAW_ALIAS}` (an agent of its own; the others "
            "are as they were)"
        ),
        session_key=True,
        stored_key=zeroclaw_key,
    ),
}


@dataclass(frozen=True)
class Change:
    path: Path
    before: str
    after: str
    notes: tuple[str, ...] = ()  # what the user should know of it, one line each

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


def _read(agent: Agent, path: Path | None) -> tuple[Path, str]:
    where = path or agent.path()
    return where, where.read_text() if where.exists() else ""


def stored_key(agent: Agent, path: Path | None = None) -> str | None:
    """The key our entry in the agent's file already has (None: none, or an agent whose key
    is not kept there); ConfigError when the file cannot be connected."""
    where, text = _read(agent, path)
    if agent.stored_key is None:
        return None
    try:
        return agent.stored_key(text)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc} (left untouched)") from None


def plan(agent: Agent, target: Target, path: Path | None = None) -> Change:
    """What connecting `agent` would change; ConfigError when its file cannot be read."""
    where, before = _read(agent, path)
    try:
        after = agent.merge(before, target)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc} (left untouched)") from None
    notes = tuple(agent.notes(before, after, target)) if agent.notes else ()
    return Change(where, before, after, notes)


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
