"""What the Responses and Messages front doors share: reading a request, reading the chat
stream they translate, writing server-sent events."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from claw_stream.dialect import OpenAIError
from claw_stream.gateway.protocol import SESSION_FIELDS

M = TypeVar("M", bound=BaseModel)


def parse_body(raw: bytes, model: type[M]) -> tuple[dict[str, Any], M]:
    """The JSON object of a request and its checked model; 400 (as those APIs answer) when
    it is no JSON object or breaks the model."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise OpenAIError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "request body must be a JSON object")
    try:
        return body, model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise OpenAIError(400, f"{where}: {first['msg']}", param=where) from None


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
