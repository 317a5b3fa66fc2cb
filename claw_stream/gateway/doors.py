"""The model APIs the gateway serves, one line each.

A new dialect is a folder (its `protocol.py`, `serving.py`, `format.py`) and a line here: the
paths route it under every base URL (`paths.py`), FastAPI declares it in the OpenAPI document
(`api_router.py`), and the front door serves it with its own error shape (`front_door.py`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from claw_stream.dialect import OpenAIError, anthropic_error_of, openai_error_of
from claw_stream.gateway.chat.protocol import ChatRequest
from claw_stream.gateway.chat.serving import Answer, ServingChat
from claw_stream.gateway.completions.protocol import CompletionRequest
from claw_stream.gateway.completions.serving import ServingCompletions
from claw_stream.gateway.messages.protocol import CountTokensRequest, MessagesRequest
from claw_stream.gateway.messages.serving import ServingMessages
from claw_stream.gateway.responses.protocol import ResponsesRequest
from claw_stream.gateway.responses.serving import ServingResponses

if TYPE_CHECKING:
    from claw_stream.settings import Settings

# a model API's handler: (headers, raw body, path session, path group) -> its answer
Serve = Callable[[Mapping[str, str], bytes, str | None, str | None], Awaitable[Answer]]
ErrorShape = Callable[[OpenAIError], dict[str, Any]]


@dataclass(frozen=True)
class Door:
    api: str  # the name metrics and routes use
    endpoint: str  # the path after a base URL
    request: type[BaseModel]  # what the OpenAPI document says it takes
    tag: Literal["openai", "anthropic"]
    serving: Callable[[ServingChat, Settings], Serve]  # its handler, made once per process
    error_shape: ErrorShape = openai_error_of


DOORS = (
    Door("chat", "/chat/completions", ChatRequest, "openai", lambda chat, _: chat.chat),
    Door(
        "completions",
        "/completions",
        CompletionRequest,
        "openai",
        lambda chat, _: ServingCompletions(chat).create,
    ),
    Door(
        "responses",
        "/responses",
        ResponsesRequest,
        "openai",
        lambda chat, s: ServingResponses(chat, s.gateway.responses_store_size).create,
    ),
    Door(
        "messages",
        "/messages",
        MessagesRequest,
        "anthropic",
        lambda chat, _: ServingMessages(chat).create,
        anthropic_error_of,
    ),
    Door(
        "count_tokens",
        "/messages/count_tokens",
        CountTokensRequest,
        "anthropic",
        lambda chat, _: ServingMessages(chat).count_tokens,
        anthropic_error_of,
    ),
)
