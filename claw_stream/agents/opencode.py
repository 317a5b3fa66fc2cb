"""opencode's config: `$OPENCODE_CONFIG` where set, else its global config folder
(`$XDG_CONFIG_HOME/opencode/`, by default `~/.config/opencode/`): the `opencode.jsonc`,
`opencode.json` or `config.json` there (it reads all three, in the reverse order), a new
`opencode.json` where there is none. JSON with comments: edited in place (`jsonc.py`), so its
comments, order and indentation stay.

`provider.claw-stream`: an OpenAI-compatible provider (`npm: "@ai-sdk/openai-compatible"`,
which opencode bundles), `options.baseURL` with /v1 and `options.apiKey`, and the served model
under `models` with its `limit` (`context`, and `output`: the `max_tokens` it asks for; without
a limit opencode assumes none and never compacts). `model` and `small_model` (its titles) are
`claw-stream/<model>`. Below 32,768 tokens of context its small-model profile is written too
(`SMALL_PROFILE`: four of its ten tools off in `tools`, so its first prompt of ~7.6k tokens
becomes ~5.3k, which fits 8,192 with an answer of 2,048); with more context a small profile
this command wrote is taken out again, anything else left as the user set it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from claw_stream.agents import jsonc
from claw_stream.agents.target import PROVIDER, SMALL_CONTEXT, Target

SCHEMA = "https://opencode.ai/config.json"
OPENAI_COMPATIBLE = "@ai-sdk/openai-compatible"
FILES = ("opencode.jsonc", "opencode.json", "config.json")  # the first found is written
# opencode's tools that its small-model profile turns off (~2.1k tokens of its ~7.6k prompt):
# sub-agents, the to-do list, web pages and skills; bash, read, edit, write, glob, grep stay
SMALL_PROFILE = ("task", "todowrite", "webfetch", "skill")


def config_path() -> Path:
    if path := os.environ.get("OPENCODE_CONFIG", "").strip():
        return Path(path).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME", "").strip()
    folder = (Path(xdg).expanduser() if xdg else Path.home() / ".config") / "opencode"
    return next((folder / f for f in FILES if (folder / f).exists()), folder / "opencode.json")


def _get(data: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _model_entry(config: dict[str, Any], target: Target) -> dict[str, Any]:
    """Our provider's entry for the served model: the one there, with our name and limits."""
    entry = _get(config, ("provider", PROVIDER, "models", target.model))
    entry = dict(entry) if isinstance(entry, dict) else {}
    entry.setdefault("name", f"{target.model} via claw-stream")
    if target.context is not None:
        limit = dict(entry["limit"]) if isinstance(entry.get("limit"), dict) else {}
        limit["context"] = target.context
        limit["output"] = target.answer_tokens
        entry["limit"] = limit
    return entry


def merge(text: str, target: Target) -> str:
    """opencode's config with our provider, its model chosen for every role."""
    config = jsonc.read(text)
    if not text.strip():
        text = jsonc.set_member("", ("$schema",), SCHEMA)
    ref = f"{PROVIDER}/{target.model}"
    wanted: list[tuple[tuple[str, ...], Any]] = [
        (("provider", PROVIDER, "npm"), OPENAI_COMPATIBLE),
        (("provider", PROVIDER, "name"), PROVIDER),
        (("provider", PROVIDER, "options", "baseURL"), f"{target.base_url}/v1"),
        (("provider", PROVIDER, "options", "apiKey"), target.key),
        # the gateway serves one model
        (("provider", PROVIDER, "models"), {target.model: _model_entry(config, target)}),
        (("model",), ref),
        (("small_model",), ref),  # titles and summaries: the same model
    ]
    if target.small:
        wanted += [(("tools", tool), False) for tool in SMALL_PROFILE]
    for path, value in wanted:
        if _get(config, path) != value:
            text = jsonc.set_member(text, path, value)
    tools = config.get("tools")
    written = isinstance(tools, dict) and all(tools.get(t) is False for t in SMALL_PROFILE)
    if not target.small and isinstance(tools, dict) and written:  # as this command wrote it
        for tool in SMALL_PROFILE:
            text = jsonc.remove_member(text, ("tools", tool))
        if set(tools) <= set(SMALL_PROFILE):
            text = jsonc.remove_member(text, ("tools",))
    return text


def stored_key(text: str) -> str | None:
    key = _get(jsonc.read(text), ("provider", PROVIDER, "options", "apiKey"))
    return key if isinstance(key, str) and key else None


def notes(before: str, after: str, target: Target) -> list[str]:
    if target.small:
        return [
            f"the model's context ({target.context:,} tokens) is below {SMALL_CONTEXT:,}: "
            f"opencode's small-model profile ({', '.join(SMALL_PROFILE)} off in `tools`): its "
            "first prompt is ~5.3k tokens instead of ~7.6k, answers up to "
            f"{target.answer_tokens:,}"
        ]
    if target.context is None:
        return ["the gateway did not say the model's context: opencode will not compact"]
    return [
        f"the model's context ({target.context:,} tokens) holds opencode's full prompt "
        "(~7.6k tokens, its ten tools)"
    ]
