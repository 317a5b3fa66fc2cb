"""OpenClaw's config: `$OPENCLAW_CONFIG_PATH`, else `$OPENCLAW_STATE_DIR/openclaw.json`, else
`~/.openclaw/openclaw.json` (`$OPENCLAW_HOME` for `~`). JSON5: read with `json5`, written back
as standard JSON (itself JSON5) in the file's own indentation and key order; comments in it are
not kept (the backup keeps them).

`models.providers.claw-stream` (`api: "openai-completions"`, `baseUrl` with /v1, `apiKey`) with
the served model, its `contextWindow` (without one OpenClaw assumes 200,000 tokens) and
`maxTokens`, and `compat.sendSessionAffinityHeaders: true` (a model's `compat`; without it
OpenClaw sends no session id to a custom provider), chosen as `agents.defaults.model` (its
`primary` where it is an object, so `fallbacks` stay). The id is not `openai`, which OpenClaw
routes as OpenAI's own. Below 32,768 tokens of context its small-model profile is written too
(`SMALL_PROFILE`: its prompt of ~60 KB and 12 tools, 12.7k tokens and 15k after two tool calls,
becomes ~10.6 KB and 3 tools, which fits 8,192); with more context, the full one: a small
profile this command wrote is taken out again, anything else left as the user set it.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import json5

from claw_stream.agents.target import (
    PROVIDER,
    SMALL_CONTEXT,
    AgentConfigFileError,
    Target,
    one_line,
)

# OpenClaw's small-model profile, below SMALL_CONTEXT tokens: (object path, key, value)
SMALL_PROFILE: tuple[tuple[tuple[str, ...], str, object], ...] = (
    (("tools",), "profile", "minimal"),  # 3 tools instead of 12
    (("agents", "defaults"), "contextInjection", "never"),  # no workspace files in the prompt
    (("agents", "defaults"), "skipBootstrap", True),  # nor created to be read
)


def config_path() -> Path:
    if path := os.environ.get("OPENCLAW_CONFIG_PATH", "").strip():
        return Path(path).expanduser()
    if state := os.environ.get("OPENCLAW_STATE_DIR", "").strip():
        return Path(state).expanduser() / "openclaw.json"
    home = os.environ.get("OPENCLAW_HOME", "").strip()
    return (Path(home).expanduser() if home else Path.home()) / ".openclaw" / "openclaw.json"


def _object(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """`parent[key]`, an object, created empty where missing."""
    value = parent.setdefault(key, {})
    if not isinstance(value, dict):
        raise AgentConfigFileError(f"`{where}` is not an object")
    return value


def _config(text: str) -> dict[str, Any]:
    try:
        config = json5.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise AgentConfigFileError(f"not valid JSON5: {one_line(exc)}") from None
    if not isinstance(config, dict):
        raise AgentConfigFileError("expected a JSON5 object")
    return config


def _provider(config: dict[str, Any]) -> dict[str, Any] | None:
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


def merge(text: str, target: Target) -> str:
    """OpenClaw's openclaw.json with our provider, its model chosen as the agents' default."""
    config = _config(text)
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


def stored_key(text: str) -> str | None:
    provider = _provider(_config(text))
    key = provider.get("apiKey") if provider else None
    return key if isinstance(key, str) and key else None


def notes(before: str, after: str, target: Target) -> list[str]:
    said = []
    if target.small:
        said.append(
            f"the model's context ({target.context:,} tokens) is below {SMALL_CONTEXT:,}: "
            'OpenClaw\'s small-model profile (tools.profile "minimal", agents.defaults.'
            'contextInjection "never", skipBootstrap): its request is ~10.6 KB with 3 tools '
            "instead of ~60 KB with 12 (~12.7k tokens)"
        )
    elif target.context is None:
        said.append(
            "the gateway did not say the model's context: OpenClaw assumes 200,000 tokens; "
            "its full profile"
        )
    else:
        said.append(
            f"the model's context ({target.context:,} tokens) holds OpenClaw's full prompt: "
            "its full profile (all its tools and workspace files)"
        )
    if before.strip() and after != before:
        try:
            json.loads(before)
        except ValueError:
            said.append(
                "the file was JSON5 and is written back as plain JSON (valid JSON5): its "
                "comments are not kept, the backup has them"
            )
    return said
