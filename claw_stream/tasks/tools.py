"""Python functions named by a dataset, as OpenAI tools: the schema from the signature, the
description from the docstring, and a call that turns any failure into the tool's answer."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_type_hints

_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
TOOL_TIMEOUT_S = 10.0
MAX_RESULT_CHARS = 4000


class ToolError(ValueError):
    """A dataset names a function that cannot be a tool."""


def import_function(path: str) -> Callable[..., Any]:
    module_name, _, name = path.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ToolError(f"cannot import {path}: {exc}") from None
    if not callable(function):
        raise ToolError(f"{path} is not callable")
    return function


@dataclass(frozen=True)
class Tool:
    name: str
    function: Callable[..., Any]
    schema: dict[str, Any]  # the OpenAI `tools` entry

    async def call(self, arguments: str) -> str:
        """The function's result as text; a bad call or an error is the answer, never raised."""
        try:
            kwargs = json.loads(arguments or "{}")
            if not isinstance(kwargs, dict):
                raise ValueError("arguments must be a JSON object")
            inspect.signature(self.function).bind(**kwargs)
        except (ValueError, TypeError) as exc:
            return f"error: bad arguments for {self.name}: {exc}"
        try:
            result = await asyncio.wait_for(
                asyncio.to_thread(self.function, **kwargs), TOOL_TIMEOUT_S
            )
        except TimeoutError:
            return f"error: {self.name} took longer than {TOOL_TIMEOUT_S:.0f} s"
        except Exception as exc:  # the model sees what went wrong, as with any tool
            return f"error: {exc}"
        text = result if isinstance(result, str) else json.dumps(result, default=str)
        return text[:MAX_RESULT_CHARS]


def tool_of(path: str) -> Tool:
    function = import_function(path)
    name = path.rsplit(":", 1)[1]
    hints = get_type_hints(function)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(function).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolError(f"{path}: *args / **kwargs cannot be described to a model")
        kind = _JSON_TYPES.get(hints.get(param.name, str))
        if kind is None:
            raise ToolError(f"{path}: parameter {param.name} must be str, int, float or bool")
        properties[param.name] = {"type": kind}
        if param.default is param.empty:
            required.append(param.name)
    doc = inspect.getdoc(function) or name
    schema = {
        "type": "function",
        "function": {
            "name": name,
            "description": doc.split("\n\n")[0],
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }
    return Tool(name, function, schema)


def tools_of(paths: list[str]) -> dict[str, Tool]:
    tools = [tool_of(p) for p in paths]
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise ToolError(f"two tools share a name: {names}")
    return {t.name: t for t in tools}
