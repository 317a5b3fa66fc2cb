"""aider's config: `~/.aider.conf.yml` (it also reads one in the git root and the current
folder, which win over it), its options by their long names: `openai-api-base` with /v1,
`openai-api-key`, and `model: openai/<model>` (litellm's prefix for an OpenAI-compatible
server), the same model as its weak model (commit messages, chat summaries) and editor model.
YAML edited in place (`yaml_doc.py`): comments and order stay.

The model's context goes beside it, in `~/.aider.model.metadata.json` (litellm's model
metadata, which aider reads from the same folders): `max_input_tokens`, `max_output_tokens`
and no cost. Without it aider warns of an unknown model on every start and keeps its chat
history to 1k tokens before summarising it.

aider names no session, and the conversation it sends is not the one it sent before (its
reminder goes with the last user message only, its history is put before the files it was
told of), so the gateway cannot join its calls by their main line: it gets a fresh session
key (`/rl/start_session`), which ties its calls together.
"""

from __future__ import annotations

from pathlib import Path

from claw_stream.agents import jsonc, yaml_doc
from claw_stream.agents.target import Target

METADATA_FILE = ".aider.model.metadata.json"
LITELLM_PREFIX = "openai/"  # litellm's OpenAI-compatible provider


def config_path() -> Path:
    return Path.home() / ".aider.conf.yml"


def model_name(target: Target) -> str:
    return f"{LITELLM_PREFIX}{target.model}"


def merge(text: str, target: Target) -> str:
    """aider's .aider.conf.yml with the gateway as its OpenAI-compatible server."""
    doc = yaml_doc.load(text)
    name = model_name(target)
    changed = False
    for key, value in (
        ("openai-api-base", f"{target.base_url}/v1"),  # litellm posts {base}/chat/completions
        ("openai-api-key", target.key),
        ("model", name),
        ("weak-model", name),  # its commit messages and chat summaries
        ("editor-model", name),  # its architect mode's editor
    ):
        changed = yaml_doc.put(doc, (key,), value) or changed
    return yaml_doc.dump(text, doc) if changed else text


def merge_metadata(text: str, target: Target) -> str:
    """aider's .aider.model.metadata.json with the served model's context."""
    if target.context is None:
        return text
    entry = {
        "max_input_tokens": target.context,
        "max_output_tokens": target.answer_tokens,
        "max_tokens": target.answer_tokens,
        "input_cost_per_token": 0,
        "output_cost_per_token": 0,
        "litellm_provider": "openai",
        "mode": "chat",
    }
    name = model_name(target)
    if jsonc.read(text).get(name) == entry:
        return text
    return jsonc.set_member(text, (name,), entry)


def stored_key(text: str) -> str | None:
    key = yaml_doc.load(text).get("openai-api-key")
    return key if isinstance(key, str) and key else None


def notes(before: str, after: str, target: Target) -> list[str]:
    if target.context is None:
        return ["the gateway did not say the model's context: aider will call it unknown"]
    return [
        f"its context ({target.context:,} tokens) in {METADATA_FILE} beside it; aider's first "
        "prompt is ~1k tokens (whole-file edits), plus the files you add and, in a git "
        "repository, its repo map"
    ]
