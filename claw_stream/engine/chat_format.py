"""Messages -> prompt token ids (the model's chat template), and tool calls out of the model's text.

Tool calls use the Hermes convention `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
which most open chat templates (Qwen, Hermes, SmolLM3) speak. A template that does not render
`tools` itself (SmolLM2's) gets them described in the system message in that convention.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from typing import Any

from claw_stream.dialect import flatten_content

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
_TOOL_RE = re.compile(re.escape(TOOL_OPEN) + r"\s*(.*?)\s*" + re.escape(TOOL_CLOSE), re.DOTALL)


def tools_instruction(tools: list[dict[str, Any]], tool_choice: Any) -> str:
    specs = [t.get("function", t) for t in tools]
    text = (
        "You can call functions. Their JSON schemas are:\n<tools>\n"
        + "\n".join(json.dumps(s, ensure_ascii=False) for s in specs)
        + "\n</tools>\nTo call one, answer with "
        + f'{TOOL_OPEN}{{"name": <function-name>, "arguments": <arguments-object>}}{TOOL_CLOSE}'
    )
    if isinstance(tool_choice, dict):
        text += f"\nYou must call the function {tool_choice.get('function', {}).get('name')}."
    elif tool_choice == "required":
        text += "\nYou must call one of the functions."
    return text


def normalise_messages(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    template: str,
) -> list[dict[str, Any]]:
    """Messages as a simple chat template can render them: string content, tool calls as text."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        text = flatten_content(message.get("content"))
        if role == "developer":
            role = "system"
        if role == "assistant" and message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                fn = call.get("function", {})
                args = fn.get("arguments", "{}")
                with contextlib.suppress(json.JSONDecodeError):
                    args = json.loads(args) if isinstance(args, str) else args
                calls.append(
                    TOOL_OPEN + json.dumps({"name": fn.get("name"), "arguments": args}) + TOOL_CLOSE
                )
            text = (text + "\n" if text else "") + "\n".join(calls)
        out.append({"role": role, "content": text})
    if tools and tool_choice != "none" and "tools" not in template:
        instruction = tools_instruction(tools, tool_choice)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + instruction}
        else:
            out.insert(0, {"role": "system", "content": instruction})
    return out


def render_prompt(
    tokenizer: Any,
    request_messages: list[dict[str, Any]],
    tools: Any,
    tool_choice: Any,
    add_generation_prompt: bool = True,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """`template_kwargs` are vLLM's `chat_template_kwargs`: variables the template reads
    (`enable_thinking` for Qwen3's); a template ignores those it does not know."""
    template = tokenizer.chat_template or ""
    messages = normalise_messages(request_messages, tools, tool_choice, template)
    kwargs: dict[str, Any] = {
        **(template_kwargs or {}),
        "add_generation_prompt": add_generation_prompt,
        "tokenize": True,
    }
    if tools and "tools" in template:
        kwargs["tools"] = tools
    ids = tokenizer.apply_chat_template(messages, **kwargs)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


@dataclass
class ParsedOutput:
    content: str | None
    tool_calls: list[tuple[str, str]]  # (name, arguments JSON text)


def parse_tool_calls(text: str) -> ParsedOutput:
    calls: list[tuple[str, str]] = []
    for match in _TOOL_RE.finditer(text):
        try:
            obj = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        calls.append(
            (obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))
        )
    if not calls:
        return ParsedOutput(text, [])
    rest = _TOOL_RE.sub("", text).strip()
    return ParsedOutput(rest or None, calls)


def held_back(text: str) -> int:
    """How many trailing characters might be the start of a tool-call marker (not yet streamable)."""
    for n in range(min(len(TOOL_OPEN) - 1, len(text)), 0, -1):
        if TOOL_OPEN.startswith(text[-n:]):
            return n
    return 0
