"""Edits of an agent's YAML config that keep the rest as it was: ruamel.yaml's round trip
(comments, key order, quotes), keys set only where they differ, so a second run gives the same
text, and the file's own text back where nothing changed."""

from __future__ import annotations

import io
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import YAMLError

from claw_stream.agents.target import AgentConfigFileError, one_line


def _yaml() -> YAML:
    yaml = YAML()  # round trip
    yaml.preserve_quotes = True
    yaml.width = 4096  # never fold a long value
    return yaml


def load(text: str) -> CommentedMap:
    """The file's mapping (empty for a file of comments only); AgentConfigFileError when it is
    not YAML or not a mapping."""
    try:
        doc = _yaml().load(text) if text.strip() else None
    except YAMLError as exc:
        raise AgentConfigFileError(f"not valid YAML: {one_line(exc)}") from None
    if doc is None:
        return CommentedMap()
    if not isinstance(doc, CommentedMap):
        raise AgentConfigFileError("expected a YAML mapping")
    return doc


def get(doc: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def put(doc: CommentedMap, path: tuple[str, ...], value: Any) -> bool:
    """`value` at `path` (mappings on the way created); whether anything changed."""
    node = doc
    for i, key in enumerate(path[:-1]):
        child = node.get(key)
        if child is None:
            child = node[key] = CommentedMap()
        elif not isinstance(child, dict):
            raise AgentConfigFileError(f"`{'.'.join(path[: i + 1])}` is not a mapping")
        node = child
    if path[-1] in node and node[path[-1]] == value:
        return False
    node[path[-1]] = value
    return True


def dump(text: str, doc: CommentedMap) -> str:
    """`doc` as YAML; after the comments of a file that held nothing else."""
    out = io.StringIO()
    _yaml().dump(doc, out)
    if text.strip() and _yaml().load(text) is None:  # comments only: ours after them
        return text + ("" if text.endswith("\n") else "\n") + out.getvalue()
    return out.getvalue()
