"""Hermes Agent's config: `$HERMES_HOME/config.yaml` (default `~/.hermes/`), its `model`
section as its own set-up writes a custom endpoint: `provider: custom`, `base_url` with /v1,
`api_key`, `default` (the model), and `context_length` and `max_tokens` (without them it asks
for an answer as long as the context, which no prompt leaves room for). A `model` that is a
name only becomes that section. YAML edited in place (`yaml_doc.py`): comments and order
stay; its other sections (providers, fallbacks, toolsets) are left as they are.

Hermes Agent refuses a model of less than 64,000 tokens of context (its MINIMUM_CONTEXT_LENGTH)
before its first call: connect says so where the gateway serves less. It names no session on
the wire, but each call carries the conversation so far (`hermes chat --resume ID` resends it):
it gets a client key, and the gateway files each conversation as one session by its main line.
"""

from __future__ import annotations

import os
from pathlib import Path

from ruamel.yaml.comments import CommentedMap

from claw_stream.agents import yaml_doc
from claw_stream.agents.target import AgentConfigFileError, Target

HERMES_MINIMUM_CONTEXT = 64_000  # it refuses a smaller model at start


def config_path() -> Path:
    if home := os.environ.get("HERMES_HOME", "").strip():
        return Path(home).expanduser() / "config.yaml"
    return Path.home() / ".hermes" / "config.yaml"


def merge(text: str, target: Target) -> str:
    """Hermes Agent's config.yaml with the gateway as its custom endpoint."""
    doc = yaml_doc.load(text)
    model = doc.get("model")
    changed = False
    if not isinstance(model, dict):
        if model is not None and not isinstance(model, str):
            raise AgentConfigFileError("`model` is neither a model's name nor a mapping")
        doc["model"] = CommentedMap()
        changed = True
    values: dict[str, object] = {
        "default": target.model,
        "provider": "custom",
        "base_url": f"{target.base_url}/v1",  # it posts {base_url}/chat/completions
        "api_key": target.key,
    }
    if target.context is not None:
        values["context_length"] = target.context
    if target.answer_tokens is not None:
        values["max_tokens"] = target.answer_tokens
    for key, value in values.items():
        changed = yaml_doc.put(doc, ("model", key), value) or changed
    return yaml_doc.dump(text, doc) if changed else text


def stored_key(text: str) -> str | None:
    key = yaml_doc.get(yaml_doc.load(text), ("model", "api_key"))
    return key if isinstance(key, str) and key else None


def notes(before: str, after: str, target: Target) -> list[str]:
    if target.context is not None and target.context < HERMES_MINIMUM_CONTEXT:
        return [
            f"the model's context ({target.context:,} tokens) is below the "
            f"{HERMES_MINIMUM_CONTEXT:,} Hermes Agent requires: it will refuse to start. Serve "
            "a model with more context (`claw-stream up --model`, or a GPU engine); its first "
            "prompt is ~15k tokens (28 tools)"
        ]
    return [
        "Hermes Agent's first prompt is ~15k tokens (28 tools); its answers up to "
        f"{target.answer_tokens or 'its default'} tokens"
    ]
