"""Reading a front door's request body: a JSON object, checked against the door's model.

Every door refuses a body that is no JSON object with 400; a body that breaks the door's
model is 400 on the Responses, Messages and Gemini doors (as OpenAI's, Anthropic's and
Google's APIs answer) and 422 on chat, as vLLM answers.
"""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from claw_stream.dialect import OpenAIError

M = TypeVar("M", bound=BaseModel)


def read_object(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise OpenAIError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "request body must be a JSON object")
    return body


def checked(body: dict[str, Any], model: type[M], status: int = 400) -> M:
    """`body` as the door's model; `status` naming the first field that breaks it."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise OpenAIError(status, f"{where}: {first['msg']}", param=where) from None


def parse_body(raw: bytes, model: type[M]) -> tuple[dict[str, Any], M]:
    """The JSON object of a request and its checked model (400 when it breaks it)."""
    body = read_object(raw)
    return body, checked(body, model)
