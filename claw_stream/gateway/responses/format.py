"""The OpenAI Responses API in terms of chat completions: its input as chat messages, a chat
answer (whole, or chunk by chunk) as a Response and its stream events."""

from __future__ import annotations

import base64
import json
import time
from typing import Any, NamedTuple

from claw_stream.gateway.protocol import DOOR_FIELD
from claw_stream.gateway.responses.protocol import ResponsesRequest
from claw_stream.gateway.translate import (
    arguments_object,
    chat_tool,
    door_note,
    session_fields,
    sse,
    text_of,
)

TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


# --- request -------------------------------------------------------------------------------


class Origin(NamedTuple):
    """A tool as the client named it."""

    namespace: str | None
    name: str
    custom: bool  # a freeform tool: its call is a `custom_tool_call`


class ToolMap:
    """The client's tools as the model sees them (chat functions), and the model's calls back
    as the client's items.

    A `namespace` tool (Codex groups its sub-agent and MCP tools so) is flattened into its
    functions, each named `<namespace>__<name>` for the model (`<namespace><name>` when the
    namespace ends in `_`, as MCP's `mcp__server__` does); a call comes back as the real API
    sends it, the bare name with a `namespace` field, which is what Codex routes on. A `custom`
    (freeform) tool becomes a function of one string, `input`, and its call a
    `custom_tool_call`. Built-in tools the engines cannot run (web search, file search, a code
    interpreter, a computer, image generation, a shell, remote MCP) are left out of what the
    model sees, and the Step says so."""

    def __init__(self, tools: list[dict[str, Any]] | None):
        self.tools: list[dict[str, Any]] = []
        self.left_out: list[str] = []
        self.origin: dict[str, Origin] = {}  # by the name the model sees
        for i, tool in enumerate(tools or ()):
            kind = tool.get("type")
            if kind == "namespace":
                if not isinstance(tool.get("name"), str):
                    raise ValueError(f"tools[{i}]: a namespace tool needs a name")
                for j, inner in enumerate(tool.get("tools") or ()):
                    self._add(inner, tool["name"], f"tools[{i}].tools[{j}]")
            elif kind in ("function", "custom"):
                self._add(tool, None, f"tools[{i}]")
            else:
                self.left_out.append(str(tool.get("name") or kind))

    def _add(self, tool: dict[str, Any], namespace: str | None, where: str) -> None:
        kind, name = tool.get("type"), tool.get("name")
        if kind not in ("function", "custom") or not isinstance(name, str):
            raise ValueError(f"{where}: only function and custom tools with a name are supported")
        chat_name = self.chat_name(namespace, name)
        parameters = FREEFORM if kind == "custom" else tool.get("parameters")
        self.tools.append(chat_tool(chat_name, tool.get("description"), parameters))
        self.origin[chat_name] = Origin(namespace, name, kind == "custom")

    def origin_of(self, chat_name: str) -> Origin:
        """The client's tool behind a name the model called; a name it never offered is
        passed on as it is."""
        return self.origin.get(chat_name) or Origin(None, chat_name, False)

    @staticmethod
    def chat_name(namespace: str | None, name: str) -> str:
        if not namespace:
            return name
        return namespace + name if namespace.endswith("_") else f"{namespace}__{name}"

    def call_item(
        self, item_id: str, call_id: str, chat_name: str, arguments: str, status: str
    ) -> dict[str, Any]:
        """A chat tool call as the client's output item."""
        namespace, name, custom = self.origin_of(chat_name)
        if custom:
            text = arguments_object(arguments).get("input", arguments)
            return {
                "type": "custom_tool_call",
                "id": item_id,
                "call_id": call_id,
                "name": name,
                "input": text if isinstance(text, str) else json.dumps(text),
                "status": status,
            }
        item = call_item(item_id, call_id, name, arguments, status)
        if namespace:
            item["namespace"] = namespace
        return item


FREEFORM = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}


def input_messages(
    value: str | list[dict[str, Any]], tools: ToolMap | None = None
) -> list[dict[str, Any]]:
    """Responses input items as chat messages; function calls join the assistant message
    they follow. ValueError/KeyError/TypeError name what cannot be read."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        kind = item.get("type")
        if kind in (None, "message"):
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ValueError(f"input[{i}].role must be user, system, developer or assistant")
            messages.append({"role": role, "content": text_of(item.get("content"), TEXT_PARTS)})
        elif kind in ("function_call", "custom_tool_call"):
            name = ToolMap.chat_name(item.get("namespace"), str(item["name"]))
            if kind == "function_call":
                arguments = item.get("arguments") or ""
            else:
                arguments = json.dumps({"input": str(item.get("input", ""))})
            call = {
                "id": str(item["call_id"]),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item["output"]
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": str(item["call_id"]),
                    "content": output if isinstance(output, str) else text_of(output, TEXT_PARTS),
                }
            )
        elif kind == "reasoning":
            # the model's own reasoning is not part of its next prompt; with `store: false`
            # Codex sends it back (`encrypted_content`, ours) and it is taken and left out
            continue
        else:
            raise ValueError(f"input[{i}]: items of type {kind!r} are not supported")
    return messages


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ValueError("tool_choice must be auto, none, required or a function by name")


def reasoning_settings(reasoning: dict[str, Any] | None) -> dict[str, Any]:
    """`reasoning.effort` as the engine's reasoning settings, by vLLM's names (see
    `messages_format.reasoning_settings`)."""
    effort = (reasoning or {}).get("effort")
    if effort is None:
        return {}
    if effort not in EFFORTS:
        raise ValueError(f"reasoning.effort must be one of {', '.join(EFFORTS)}")
    settings: dict[str, Any] = {
        "chat_template_kwargs": {"enable_thinking": effort not in ("none", "minimal")}
    }
    if effort in ("low", "medium", "high"):
        settings["reasoning_effort"] = effort
    return settings


EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
# accepted, and recorded in the Step as not honoured: they steer OpenAI's own service
NOT_HONOURED = ("prompt_cache_key", "client_metadata", "service_tier", "truncation", "user")


def chat_body(
    req: ResponsesRequest, body: dict[str, Any], messages: list[dict[str, Any]], tools: ToolMap
) -> dict[str, Any]:
    chat: dict[str, Any] = {"model": req.model, "messages": messages, "stream": req.stream}
    if req.stream:
        chat["stream_options"] = {"include_usage": True}
    if tools.tools:
        chat["tools"] = tools.tools
        if req.tool_choice is not None:
            chat["tool_choice"] = chat_tool_choice(req.tool_choice)
    for ours, theirs in (
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
    ):
        value = getattr(req, ours)
        if value is not None:
            chat[theirs] = value
    chat.update(reasoning_settings(req.reasoning))
    chat[DOOR_FIELD] = door_note(
        "responses", [k for k in NOT_HONOURED if body.get(k) is not None], tools.left_out
    )
    return chat | session_fields(body)


# --- response ------------------------------------------------------------------------------


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": content,
    }


def call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str = "completed"
) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def reasoning_item(item_id: str, text: str, encrypted: bool = False) -> dict[str, Any]:
    item = {
        "type": "reasoning",
        "id": item_id,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }
    if encrypted:
        item["encrypted_content"] = encrypted_content(text)
    return item


def encrypted_content(text: str) -> str:
    """The opaque token a client that keeps no server state (`store: false`) asks for with
    `include: ["reasoning.encrypted_content"]` and sends back with its next input. Ours holds
    the reasoning's text, which is already in the item: nothing secret to hide, and the next
    prompt leaves reasoning out whatever the token says."""
    return base64.urlsafe_b64encode(text.encode()).decode()


def output_items(
    message: dict[str, Any], key: str, tools: ToolMap, encrypted: bool = False
) -> list[dict[str, Any]]:
    """A chat answer's assistant message as Response output items (ids made from `key`)."""
    items = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(f"rs_{key}", message["reasoning_content"], encrypted))
    if message.get("content"):
        items.append(message_item(f"msg_{key}", message["content"]))
    for i, call in enumerate(message.get("tool_calls") or ()):
        fn = call.get("function") or {}
        items.append(
            tools.call_item(
                f"fc_{key}_{i}",
                str(call.get("id") or f"call_{key}_{i}"),
                str(fn.get("name", "")),
                str(fn.get("arguments") or ""),
                "completed",
            )
        )
    return items


def usage_of(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": int(cached)},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
    }


def response_object(
    req: ResponsesRequest,
    response_id: str,
    created: int,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None = None,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    incomplete = (
        {"reason": "max_output_tokens"}
        if finish_reason == "length" and status != "failed"
        else None
    )
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": "incomplete" if incomplete else status,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": req.model,
        "output": output,
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": req.store,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": req.tool_choice or "auto",
        "tools": req.tools or [],
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "truncation": "disabled",
        "usage": usage,
        "metadata": req.metadata or {},
    }


def now() -> int:
    return int(time.time())


# --- stream --------------------------------------------------------------------------------


class ResponsesStream:
    """Chat chunks in, Responses stream events out (`response.created` ... `response.completed`).

    Each output item opens when its first delta arrives and closes when another kind of
    output starts, or at the end."""

    def __init__(self, req: ResponsesRequest, response_id: str, key: str, tools: ToolMap):
        self.req = req
        self.tools = tools
        self.encrypted = req.wants_encrypted_reasoning
        self.response_id = response_id
        self.key = key
        self.created = now()
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # closed items, in order
        self.open: dict[str, Any] | None = None  # the item receiving deltas
        self.open_kind = ""  # message | reasoning | call:<index>
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.calls: list[dict[str, Any]] = []  # the model's tool calls, by their chat names

    def _client_call(self, call: dict[str, Any], status: str = "in_progress") -> dict[str, Any]:
        return self.tools.call_item(
            call["id"], call["call_id"], call["name"], call["arguments"], status
        )

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse(kind, payload)

    def start(self) -> bytes:
        shell = response_object(
            self.req, self.response_id, self.created, status="in_progress", output=[]
        )
        return self._event("response.created", response=shell) + self._event(
            "response.in_progress", response=shell
        )

    def feed(self, chunk: dict[str, Any]) -> bytes:
        out: list[bytes] = []
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                out.append(self._reasoning(delta["reasoning_content"]))
            if delta.get("content"):
                out.append(self._text(delta["content"]))
            for call in delta.get("tool_calls") or ():
                out.append(self._call(call))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return b"".join(out)

    def _index(self) -> int:
        return len(self.items)

    def _text(self, text: str) -> bytes:
        out = b""
        if self.open_kind != "message":
            out += self._close()
            self.open, self.open_kind = (
                message_item(f"msg_{self.key}", "", "in_progress"),
                "message",
            )
            out += self._event(
                "response.output_item.added",
                output_index=self._index(),
                item={**self.open, "content": []},
            )
            out += self._event(
                "response.content_part.added",
                item_id=self.open["id"],
                output_index=self._index(),
                content_index=0,
                part=self.open["content"][0],
            )
        assert self.open is not None
        self.open["content"][0]["text"] += text
        return out + self._event(
            "response.output_text.delta",
            item_id=self.open["id"],
            output_index=self._index(),
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def _reasoning(self, text: str) -> bytes:
        out = b""
        if self.open_kind != "reasoning":
            out += self._close()
            self.open, self.open_kind = reasoning_item(f"rs_{self.key}", ""), "reasoning"
            out += self._event(
                "response.output_item.added",
                output_index=self._index(),
                item={**self.open, "content": []},
            )
            if self.encrypted:
                self.open["encrypted_content"] = ""
        assert self.open is not None
        self.open["content"][0]["text"] += text
        return out + self._event(
            "response.reasoning_text.delta",
            item_id=self.open["id"],
            output_index=self._index(),
            content_index=0,
            delta=text,
        )

    def _call(self, call: dict[str, Any]) -> bytes:
        out = b""
        index = call.get("index", 0)
        fn = call.get("function") or {}
        if self.open_kind != f"call:{index}":
            out += self._close()
            n = len(self.calls)
            self.open = call_item(
                f"fc_{self.key}_{n}",
                str(call.get("id") or f"call_{self.key}_{n}"),
                fn.get("name") or "",
                "",
                "in_progress",
            )
            self.open_kind = f"call:{index}"
            out += self._event(
                "response.output_item.added",
                output_index=self._index(),
                item=self._client_call(self.open),
            )
        assert self.open is not None
        if fn.get("name") and not self.open["name"]:
            self.open["name"] = fn["name"]
        arguments = fn.get("arguments") or ""
        self.open["arguments"] += arguments
        if arguments and not self.tools.origin_of(self.open["name"]).custom:
            # a freeform tool's input is known whole only at its end: its item says it
            out += self._event(
                "response.function_call_arguments.delta",
                item_id=self.open["id"],
                output_index=self._index(),
                delta=arguments,
            )
        return out

    def _close(self) -> bytes:
        """Close the open item: its `.done` events, then `output_item.done`."""
        item, kind = self.open, self.open_kind
        if item is None:
            return b""
        index = self._index()
        out = b""
        if kind == "message":
            part = item["content"][0]
            out += self._event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=[],
            )
            out += self._event(
                "response.content_part.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=part,
            )
        elif kind == "reasoning":
            out += self._event(
                "response.reasoning_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=item["content"][0]["text"],
            )
            if self.encrypted:
                item["encrypted_content"] = encrypted_content(item["content"][0]["text"])
        else:
            origin = self.tools.origin_of(item["name"])
            if not origin.custom:
                out += self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=origin.name,
                    arguments=item["arguments"],
                )
            self.calls.append(item)
            item = self._client_call(item, "completed")
        if "status" in item:
            item["status"] = "completed"
        out += self._event("response.output_item.done", output_index=index, item=item)
        self.items.append(item)
        self.open, self.open_kind = None, ""
        return out

    def finish(self) -> bytes:
        out = self._close()
        final = self.final()
        return out + self._event("response.completed", response=final)

    def fail(self, message: str, code: str = "server_error") -> bytes:
        out = self._close()
        failed = response_object(
            self.req, self.response_id, self.created, status="failed", output=self.items
        )
        failed["error"] = {"code": code, "message": message}
        return out + self._event("response.failed", response=failed)

    def final(self) -> dict[str, Any]:
        return response_object(
            self.req,
            self.response_id,
            self.created,
            status="completed",
            output=self.items,
            usage=usage_of(self.usage),
            finish_reason=self.finish_reason,
        )

    def assistant_message(self) -> dict[str, Any]:
        """The answer as a chat message, for the response store."""
        message: dict[str, Any] = {"role": "assistant", "content": None}
        texts = [i["content"][0]["text"] for i in self.items if i["type"] == "message"]
        if texts:
            message["content"] = "".join(texts)
        calls = [
            {
                "id": i["call_id"],
                "type": "function",
                "function": {"name": i["name"], "arguments": i["arguments"]},
            }
            for i in self.calls
        ]
        if calls:
            message["tool_calls"] = calls
        return message
