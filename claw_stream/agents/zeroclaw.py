"""ZeroClaw's config: `$ZEROCLAW_CONFIG_DIR/config.toml` (default `~/.zeroclaw/`), its current
schema (`schema_version = 3`): `[providers.models.custom.claw_stream]` (`uri` with /v1,
`api_key`, `model`, `context_window`, `max_tokens`) and an agent of our own,
`[agents.claw_stream]`, that uses it (`zeroclaw agent -a claw_stream`; ZeroClaw has no default
agent, and its aliases take no hyphen), gated by `[risk_profiles.default]` (created empty,
ZeroClaw's own defaults, where missing).

A file in its old schema (no `schema_version = 3`: top-level `default_provider`, `api_key`,
`default_model` and `[model_providers.X]`) is read and left untouched: ZeroClaw migrates it in
memory only, and a schema-3 table written into it would be mangled by that migration (a
hand-written `[providers]` loses its `models` to the migrated ones), so the error says to run
`zeroclaw config migrate` first.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError

from claw_stream.agents.target import AgentConfigFileError, Target, one_line

ZEROCLAW_ALIAS = "claw_stream"  # ZeroClaw's aliases: lowercase letters, digits, single `_`
ZEROCLAW_SCHEMA = 3
ZEROCLAW_RISK_PROFILE = "default"


def config_path() -> Path:
    if folder := os.environ.get("ZEROCLAW_CONFIG_DIR", "").strip():
        return Path(folder).expanduser() / "config.toml"
    return Path.home() / ".zeroclaw" / "config.toml"


def _doc(text: str) -> tomlkit.TOMLDocument:
    """ZeroClaw's config in its current schema; AgentConfigFileError naming the way out
    otherwise."""
    try:
        doc = tomlkit.parse(text)
    except TOMLKitError as exc:
        raise AgentConfigFileError(f"not valid TOML: {one_line(exc)}") from None
    version = doc.get("schema_version")
    if version is None and not doc:
        doc.add("schema_version", ZEROCLAW_SCHEMA)  # a new file
    elif version is None or (isinstance(version, int) and version < ZEROCLAW_SCHEMA):
        old = [f"[model_providers.{name}]" for name in doc.get("model_providers") or {}]
        old += [k for k in ("default_provider", "default_model", "api_key") if k in doc]
        seen = f": {', '.join(old)}" if old else ""
        raise AgentConfigFileError(
            f"ZeroClaw's old config schema (schema_version {version or 1}{seen}), which "
            "ZeroClaw migrates in memory only: run `zeroclaw config migrate`, then connect again"
        )
    elif version != ZEROCLAW_SCHEMA:
        raise AgentConfigFileError(
            f"schema_version {version}: this connect knows ZeroClaw's {ZEROCLAW_SCHEMA}"
        )
    return doc


def _table(parent: Any, key: str, where: str) -> Any:
    """`parent[key]`, a table: where missing, a super table (no header of its own)."""
    if key not in parent:
        parent[key] = tomlkit.table(is_super_table=True)
    value = parent[key]
    if not isinstance(value, dict):  # a table, or tomlkit's proxy of one split in the file
        raise AgentConfigFileError(f"`{where}` is not a table")
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
        raise AgentConfigFileError(f"`{where}` is not a table")
    for name, value in values.items():
        if table.get(name) != value:
            table[name] = value
    return table


def merge(text: str, target: Target) -> str:
    """ZeroClaw's config.toml with our provider and an agent of our own that uses it."""
    doc = _doc(text)
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


def stored_key(text: str) -> str | None:
    doc = _doc(text)
    entry = ((doc.get("providers") or {}).get("models") or {}).get("custom") or {}
    key = (entry.get(ZEROCLAW_ALIAS) or {}).get("api_key")
    return str(key) if isinstance(key, str) and key else None
