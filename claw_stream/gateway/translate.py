"""What the Responses, Messages and Gemini front doors share: the session fields and tools they
hand the chat path, reading the chat stream they translate, writing server-sent events."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel

from claw_stream.gateway.protocol import SESSION_FIELDS

M = TypeVar("M", bound=BaseModel)


def session_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The gateway's session fields a client put in its body, for the chat body."""
    return {k: body[k] for k in SESSION_FIELDS if body.get(k) is not None}


def chat_tool(name: str, description: str | None, parameters: dict[str, Any] | None) -> dict:
    """A tool as a chat client sends it: name, description, parameters, in the order chat
    clients use, so a chat template that prints the tools as JSON renders the prompt a chat
    call with the same tool renders."""
    fn: dict[str, Any] = {"name": name}
    if description:
        fn["description"] = description
    fn["parameters"] = parameters or {"type": "object"}
    return {"type": "function", "function": fn}


def door_note(api: str, not_honoured: list[str], left_out_tools: list[str]) -> dict[str, Any]:
    """What a front door tells the Step of a call beyond its chat body (`DOOR_FIELD`)."""
    note: dict[str, Any] = {"api": api}
    if not_honoured:
        note["not_honoured"] = not_honoured
    if left_out_tools:
        note["left_out_tools"] = left_out_tools
    return note


def chat_chunks(block: bytes) -> Iterator[dict[str, Any]]:
    """The chat chunks in a block of the chat relay's output (whole `data:` events); `[DONE]`
    is left out, an error arrives as `{"error": ...}`."""
    for line in block.split(b"\n"):
        if line[:6] != b"data: ":
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            continue
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            chunk = {"error": {"message": "an unreadable chunk from the inference backend"}}
        if isinstance(chunk, dict):
            yield chunk


class Relay:
    """The chat stream translated block by block: each chunk through `feed`; an error the
    engine sent inside the stream is kept in `failed` instead."""

    def __init__(self, feed: Callable[[dict[str, Any]], bytes]):
        self.feed = feed
        self.failed: str | None = None

    async def blocks(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for block in chunks:
            out = []
            for chunk in chat_chunks(block):
                if "error" in chunk:
                    self.failed = str((chunk["error"] or {}).get("message") or "error")
                else:
                    out.append(self.feed(chunk))
            if out:
                yield b"".join(out)


def sse(event: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def text_of(content: Any, kinds: tuple[str, ...]) -> str:
    """The text of a string or a list of content parts (parts of the given types); other parts
    (images, files) are dropped: the policy reads text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError("content must be a string or a list of content parts")
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type") in kinds:
            texts.append(str(part.get("text", "")))
    return "\n".join(texts)


def arguments_object(arguments: str | None) -> dict[str, Any]:
    """A tool call's arguments as an object (Anthropic's `input`); text that is no JSON object
    is kept whole under `arguments`, so the client still sees what the model wrote."""
    if not arguments:
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}
