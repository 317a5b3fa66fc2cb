"""The OpenAI Responses API in terms of chat completions: its input as chat messages, a chat
answer (whole, or chunk by chunk) as a Response and its stream events."""

from __future__ import annotations

import time
from typing import Any

from claw_stream.gateway.protocol import ResponsesRequest
from claw_stream.gateway.translate import session_fields, sse, text_of

TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


# --- request -------------------------------------------------------------------------------


def input_messages(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
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
        elif kind == "function_call":
            call = {
                "id": str(item["call_id"]),
                "type": "function",
                "function": {"name": str(item["name"]), "arguments": item.get("arguments") or ""},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item["output"]
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": str(item["call_id"]),
                    "content": output if isinstance(output, str) else text_of(output, TEXT_PARTS),
                }
            )
        elif kind == "reasoning":
            continue  # the model's own reasoning is not part of its next prompt
        else:
            raise ValueError(f"input[{i}]: items of type {kind!r} are not supported")
    return messages


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise ValueError(f"tools[{i}]: only function tools with a name are supported")
        # name, description, parameters: the order chat clients use, so a chat template that
        # prints the tools as JSON renders the prompt a chat call with the same tool renders
        fn: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description"):
            fn["description"] = tool["description"]
        fn["parameters"] = tool.get("parameters") or {"type": "object"}
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ValueError("tool_choice must be auto, none, required or a function by name")


def chat_body(
    req: ResponsesRequest, body: dict[str, Any], messages: list[dict[str, Any]]
) -> dict[str, Any]:
    chat: dict[str, Any] = {"model": req.model, "messages": messages, "stream": req.stream}
    if req.stream:
        chat["stream_options"] = {"include_usage": True}
    if req.tools:
        chat["tools"] = chat_tools(req.tools)
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


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": item_id,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def output_items(message: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """A chat answer's assistant message as Response output items (ids made from `key`)."""
    items = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(f"rs_{key}", message["reasoning_content"]))
    if message.get("content"):
        items.append(message_item(f"msg_{key}", message["content"]))
    for i, call in enumerate(message.get("tool_calls") or ()):
        fn = call.get("function") or {}
        items.append(
            call_item(
                f"fc_{key}_{i}",
                str(call.get("id") or f"call_{key}_{i}"),
                str(fn.get("name", "")),
                str(fn.get("arguments") or ""),
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

    def __init__(self, req: ResponsesRequest, response_id: str, key: str):
        self.req = req
        self.response_id = response_id
        self.key = key
        self.created = now()
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # closed items, in order
        self.open: dict[str, Any] | None = None  # the item receiving deltas
        self.open_kind = ""  # message | reasoning | call:<index>
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

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
            n = len([i for i in self.items if i["type"] == "function_call"])
            self.open = call_item(
                f"fc_{self.key}_{n}",
                str(call.get("id") or f"call_{self.key}_{n}"),
                fn.get("name") or "",
                "",
                "in_progress",
            )
            self.open_kind = f"call:{index}"
            out += self._event(
                "response.output_item.added", output_index=self._index(), item=dict(self.open)
            )
        assert self.open is not None
        if fn.get("name") and not self.open["name"]:
            self.open["name"] = fn["name"]
        arguments = fn.get("arguments") or ""
        if arguments:
            self.open["arguments"] += arguments
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
        else:
            out += self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=item["arguments"],
            )
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

    def fail(self, message: str) -> bytes:
        out = self._close()
        failed = response_object(
            self.req, self.response_id, self.created, status="failed", output=self.items
        )
        failed["error"] = {"code": "server_error", "message": message}
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
            for i in self.items
            if i["type"] == "function_call"
        ]
        if calls:
            message["tool_calls"] = calls
        return message
