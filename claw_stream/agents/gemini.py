"""Gemini CLI's config, as it documents it: `~/.gemini/settings.json` (under `$GEMINI_CLI_HOME`
where set) and the `.env` beside it.

The base URL has no setting in settings.json: Gemini CLI reads `GOOGLE_GEMINI_BASE_URL` from the
environment, or from `~/.gemini/.env`, which it loads in a folder the user trusts (its trust
dialog, or `GEMINI_CLI_TRUST_WORKSPACE=true`); the key goes there too, as `GEMINI_API_KEY`.
settings.json gets the auth type (a base URL in the environment alone makes 0.61 pick its
`gateway` type, which `gemini -p` refuses as "Invalid auth method selected"), the model, a
compression threshold that fits the served context, and no usage statistics (they go to
Google's hosts, not the base URL).

Gemini CLI knows no context but its own models' (1,048,576 tokens for any other name): it
compresses a conversation once the prompt the gateway reports (`usageMetadata`) passes
`model.compressionThreshold` of that. The threshold written makes that half of the served
context, as its default does for its own models.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import json5

from claw_stream.agents.prompts import expectations
from claw_stream.agents.target import AgentConfigFileError, Target, one_line

ENV_FILE = ".env"  # beside settings.json
AUTH_TYPE = "gemini-api-key"
ASSUMED_CONTEXT = 1_048_576  # Gemini CLI's `tokenLimit` for a model it does not know
COMPRESS_AT = 0.5  # of the context, Gemini CLI's own default


def config_path() -> Path:
    return Path(os.environ.get("GEMINI_CLI_HOME") or Path.home()) / ".gemini" / "settings.json"


def compression_threshold(context: int) -> float:
    """The `model.compressionThreshold` that makes Gemini CLI compress at half of `context`."""
    return round(COMPRESS_AT * context / ASSUMED_CONTEXT, 6)


def _object(parent: dict, key: str) -> dict:
    value = parent.setdefault(key, {})
    if not isinstance(value, dict):
        raise AgentConfigFileError(f"`{key}` is not an object")
    return value


def _indent(text: str) -> str | int:
    """The indentation the file already uses (2 where it says nothing)."""
    found = re.search(r"^([ \t]+)\S", text, re.MULTILINE)
    return found[1] if found else 2


def merge(text: str, target: Target) -> str:
    """Gemini CLI's settings.json with our auth type, model and compression threshold; every
    other setting as it was, in its order and indentation. Gemini CLI reads the file with
    comments: so does this (as JSON5), writing it back without them."""
    try:
        settings = json5.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise AgentConfigFileError(f"not valid JSON: {one_line(exc)}") from None
    if not isinstance(settings, dict):
        raise AgentConfigFileError("expected a JSON object")
    auth = _object(_object(settings, "security"), "auth")
    auth["selectedType"] = AUTH_TYPE
    model = _object(settings, "model")
    model["name"] = target.model
    if target.context is not None:
        model["compressionThreshold"] = compression_threshold(target.context)
    _object(settings, "privacy")["usageStatisticsEnabled"] = False
    return json.dumps(settings, indent=_indent(text), ensure_ascii=False) + "\n"


def notes(before: str, after: str, target: Target) -> list[str]:
    said = expectations("gemini", target)
    if before.strip() and after != before:
        try:
            json.loads(before)
        except ValueError:
            said.append(
                "settings.json had comments, which Gemini CLI reads: it is written back as "
                "plain JSON without them, the backup has them"
            )
    return said


_ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=")


def _dotenv_value(value: str) -> str:
    return value if re.fullmatch(r"[\w.:/@%+,-]*", value) else json.dumps(value)


def merge_env(text: str, target: Target) -> str:
    """The `.env` beside settings.json with our base URL and key: a line of ours already there
    is rewritten where it stands (each of them: dotenv takes the last), a missing one added at
    the end; comments and every other line as they were."""
    ours = {"GOOGLE_GEMINI_BASE_URL": target.base_url, "GEMINI_API_KEY": target.key}
    lines = text.splitlines()
    seen: set[str] = set()
    for i, line in enumerate(lines):
        match = _ASSIGNMENT.match(line)
        if match is not None and match[1] in ours:
            seen.add(match[1])
            lines[i] = f"{match[1]}={_dotenv_value(ours[match[1]])}"
    lines += [f"{k}={_dotenv_value(v)}" for k, v in ours.items() if k not in seen]
    return "\n".join(lines) + "\n"
