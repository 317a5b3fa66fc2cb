"""Anthropic's Messages API in terms of chat completions: its messages as chat messages, a chat
answer (whole, or chunk by chunk) as a Message and its stream events."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from claw_stream.gateway.messages.protocol import MessagesRequest
from claw_stream.gateway.protocol import DOOR_FIELD
from claw_stream.gateway.translate import (
    arguments_object,
    chat_tool,
    door_note,
    session_fields,
    sse,
    text_of,
)

TEXT = ("text",)
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


# --- request -------------------------------------------------------------------------------


def chat_messages(req: MessagesRequest) -> list[dict[str, Any]]:
    """The system prompt and messages as chat messages: a user turn's `tool_result` blocks
    become tool messages (ahead of its text), an assistant's `tool_use` blocks its tool calls.
    ValueError/KeyError/TypeError name what cannot be read."""
    out: list[dict[str, Any]] = []
    if req.system:
        out.append({"role": "system", "content": text_of(req.system, TEXT)})
    for i, message in enumerate(req.messages):
        role = message.get("role")
        if role not in ("user", "assistant", "system"):
            raise ValueError(f"messages.{i}.role must be user, assistant or system")
        content = message.get("content")
        if role == "system":
            # Claude Code puts its environment here, after the first user message; the real
            # API takes it where it stands, and so does the prompt
            out.append({"role": "system", "content": text_of(content, TEXT)})
            continue
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise ValueError(f"messages.{i}.content must be a string or a list of blocks")
        texts, calls, results, thinking = [], [], [], []
        for j, block in enumerate(content):
            if not isinstance(block, dict):
                raise ValueError(f"messages.{i}.content.{j} must be an object")
            kind = block.get("type")
            if kind == "text":
                texts.append(str(block.get("text", "")))
            elif kind == "tool_use" and role == "assistant":
                calls.append(
                    {
                        "id": str(block["id"]),
                        "type": "function",
                        "function": {
                            "name": str(block["name"]),
                            "arguments": json.dumps(block.get("input") or {}),
                        },
                    }
                )
            elif kind == "tool_result" and role == "user":
                result = text_of(block.get("content"), TEXT)
                if block.get("is_error"):
                    result = f"Error: {result}"
                results.append(
                    {"role": "tool", "tool_call_id": str(block["tool_use_id"]), "content": result}
                )
            elif kind == "thinking" and role == "assistant":
                thinking.append(str(block.get("thinking", "")))
            elif kind in ("tool_use", "tool_result"):
                raise ValueError(f"messages.{i}.content.{j}: a {kind} block in a {role} message")
            # images, documents, redacted thinking: the policy reads text
        if role == "assistant":
            reply: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) or None}
            if calls:
                reply["tool_calls"] = calls
            if thinking:
                reply["reasoning_content"] = "\n".join(thinking)
            out.append(reply)
        else:
            out.extend(results)
            if texts or not results:
                out.append({"role": "user", "content": "\n".join(texts)})
    return out


def chat_tools(tools: list[dict[str, Any]] | None) -> tuple[list[dict[str, Any]], list[str]]:
    """Custom tools as chat tools, and the server tools left out (web search, code execution,
    a computer: tools Anthropic runs itself, which no engine here runs)."""
    out, left_out = [], []
    for i, tool in enumerate(tools or ()):
        kind = tool.get("type")
        if kind not in (None, "custom"):
            left_out.append(str(tool.get("name") or kind))
            continue
        if not isinstance(tool.get("name"), str):
            raise ValueError(f"tools.{i}.name: a custom tool needs a name")
        out.append(chat_tool(tool["name"], tool.get("description"), tool.get("input_schema")))
    return out, left_out


def chat_tool_choice(choice: dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None:
        return None
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ValueError("tool_choice.type must be auto, any, tool (with a name) or none")


THINKING = ("enabled", "adaptive", "disabled")
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "max": "high"}
# accepted, and recorded in the Step as not honoured: they steer Anthropic's own service
NOT_HONOURED = ("context_management", "metadata", "service_tier", "container", "mcp_servers")


def reasoning_settings(req: MessagesRequest) -> dict[str, Any]:
    """`thinking` and `output_config.effort` as the engine's reasoning settings, by vLLM's
    names: `chat_template_kwargs.enable_thinking` (the switch of Qwen3's and similar
    templates; a template without one ignores it) and `reasoning_effort`."""
    settings: dict[str, Any] = {}
    if req.thinking is not None:
        kind = req.thinking.get("type")
        if kind not in THINKING:
            raise ValueError("thinking.type must be enabled, adaptive or disabled")
        settings["chat_template_kwargs"] = {"enable_thinking": kind != "disabled"}
    effort = (req.output_config or {}).get("effort")
    if effort is not None:
        if effort not in EFFORTS:
            raise ValueError(f"output_config.effort must be one of {', '.join(EFFORTS)}")
        settings["reasoning_effort"] = EFFORTS[effort]
    return settings


def chat_body(req: MessagesRequest, body: dict[str, Any]) -> dict[str, Any]:
    chat: dict[str, Any] = {
        "model": req.model,
        "messages": chat_messages(req),
        "stream": req.stream,
    }
    if req.max_tokens is not None:
        chat["max_tokens"] = req.max_tokens
    if req.stream:
        chat["stream_options"] = {"include_usage": True}
    tools, left_out = chat_tools(req.tools)
    if tools:
        chat["tools"] = tools
        if req.tool_choice is not None:
            chat["tool_choice"] = chat_tool_choice(req.tool_choice)
    if req.stop_sequences:
        chat["stop"] = req.stop_sequences
    for name in ("temperature", "top_p", "top_k"):
        value = getattr(req, name)
        if value is not None:
            chat[name] = value
    chat.update(reasoning_settings(req))
    chat[DOOR_FIELD] = door_note(
        "messages", [k for k in NOT_HONOURED if body.get(k) is not None], left_out
    )
    return chat | session_fields(body)


# --- response ------------------------------------------------------------------------------


def stop_reason(choice: dict[str, Any], req: MessagesRequest) -> tuple[str, str | None]:
    """Anthropic's stop reason (and the stop sequence met) for a chat choice's finish."""
    matched = choice.get("stop_reason")
    if isinstance(matched, str) and matched in (req.stop_sequences or ()):
        return "stop_sequence", matched
    return STOP_REASONS.get(choice.get("finish_reason") or "stop", "end_turn"), None


def content_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        text = message["reasoning_content"]
        blocks.append({"type": "thinking", "thinking": text, "signature": signature(text)})
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": str(call.get("id")),
                "name": str(fn.get("name", "")),
                "input": arguments_object(fn.get("arguments")),
            }
        )
    return blocks


def signature(thinking: str) -> str:
    """A thinking block's `signature`: Anthropic's proves the block came from its model when
    it is sent back; ours is a digest a client may carry (the next prompt leaves thinking
    out whatever it says). Claude Code keeps the last `signature_delta` it received."""
    return base64.urlsafe_b64encode(hashlib.sha256(thinking.encode()).digest()).decode()


def usage_of(usage: dict[str, Any] | None) -> dict[str, int]:
    usage = usage or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {
        "input_tokens": int(usage.get("prompt_tokens") or 0),
        "output_tokens": int(usage.get("completion_tokens") or 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": int(cached),
    }


def message_object(
    message_id: str,
    model: str,
    content: list[dict[str, Any]],
    stop: tuple[str | None, str | None],
    usage: dict[str, int],
) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop[0],
        "stop_sequence": stop[1],
        "usage": usage,
    }


# --- stream --------------------------------------------------------------------------------


class MessagesStream:
    """Chat chunks in, Messages stream events out: message_start, then per content block
    content_block_start / _delta / _stop, then message_delta (stop reason, usage) and
    message_stop."""

    def __init__(self, req: MessagesRequest, message_id: str):
        self.req = req
        self.message_id = message_id
        self.index = -1  # of the open block
        self.open = ""  # text | thinking | tool:<chat index>
        self.finish: tuple[str, str | None] | None = None
        self.usage: dict[str, Any] | None = None
        self.thinking: list[str] = []  # the open thinking block's text, for its signature

    def start(self) -> bytes:
        shell = message_object(self.message_id, self.req.model, [], (None, None), usage_of(None))
        return sse("message_start", {"type": "message_start", "message": shell}) + sse(
            "ping", {"type": "ping"}
        )

    def feed(self, chunk: dict[str, Any]) -> bytes:
        out: list[bytes] = []
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                out.append(
                    self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                )
                out.append(
                    self._delta({"type": "thinking_delta", "thinking": delta["reasoning_content"]})
                )
                self.thinking.append(delta["reasoning_content"])
            if delta.get("content"):
                out.append(self._open("text", {"type": "text", "text": ""}))
                out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls") or ():
                fn = call.get("function") or {}
                out.append(
                    self._open(
                        f"tool:{call.get('index', 0)}",
                        {
                            "type": "tool_use",
                            "id": str(
                                call.get("id") or f"toolu_{self.message_id}_{self.index + 1}"
                            ),
                            "name": fn.get("name") or "",
                            "input": {},
                        },
                    )
                )
                if fn.get("arguments"):
                    out.append(
                        self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]})
                    )
            if choice.get("finish_reason"):
                self.finish = stop_reason(choice, self.req)
        return b"".join(out)

    def _open(self, kind: str, block: dict[str, Any]) -> bytes:
        if self.open == kind:
            return b""
        out = self._close()
        self.index += 1
        self.open = kind
        return out + sse(
            "content_block_start",
            {"type": "content_block_start", "index": self.index, "content_block": block},
        )

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse(
            "content_block_delta",
            {"type": "content_block_delta", "index": self.index, "delta": delta},
        )

    def _close(self) -> bytes:
        if not self.open:
            return b""
        out = b""
        if self.open == "thinking":
            text, self.thinking = "".join(self.thinking), []
            out = self._delta({"type": "signature_delta", "signature": signature(text)})
        self.open = ""
        return out + sse("content_block_stop", {"type": "content_block_stop", "index": self.index})

    def end(self) -> bytes:
        assert self.finish is not None
        usage = usage_of(self.usage)
        return (
            self._close()
            + sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": self.finish[0], "stop_sequence": self.finish[1]},
                    "usage": usage,
                },
            )
            + sse("message_stop", {"type": "message_stop"})
        )

    def error(self, kind: str, message: str) -> bytes:
        return self._close() + sse(
            "error", {"type": "error", "error": {"type": kind, "message": message}}
        )
