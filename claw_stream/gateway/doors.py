"""The model APIs the gateway serves, one line each.

A new dialect is a folder (its `protocol.py`, `door.py`, `format.py`) and a line here: the
paths route it under every base URL (`paths.py`), FastAPI declares it in the OpenAPI document
(`api_router.py`), and the front door serves it with its own error shape (`front_door.py`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from claw_stream.dialect import OpenAIError, anthropic_error_of, gemini_error_of, openai_error_of
from claw_stream.gateway.chat.door import ChatDoor, DoorAnswer
from claw_stream.gateway.chat.protocol import ChatRequest
from claw_stream.gateway.completions.door import CompletionsDoor
from claw_stream.gateway.completions.protocol import CompletionsRequest
from claw_stream.gateway.gemini.door import GeminiDoor
from claw_stream.gateway.gemini.protocol import GeminiCountTokensRequest, GenerateContentRequest
from claw_stream.gateway.messages.door import MessagesDoor
from claw_stream.gateway.messages.protocol import CountTokensRequest, MessagesRequest
from claw_stream.gateway.responses.door import ResponsesDoor
from claw_stream.gateway.responses.protocol import ResponsesRequest

if TYPE_CHECKING:
    from claw_stream.settings import Settings

# a model API's handler: (headers, raw body, path session, path group) -> its answer; the
# headers are the request's, plus `:path` (its path and query, as HTTP/2 names them)
Serve = Callable[[Mapping[str, str], bytes, str | None, str | None], Awaitable[DoorAnswer]]
ErrorShape = Callable[[OpenAIError], dict[str, Any]]


@dataclass(frozen=True)
class Door:
    api: str  # the name metrics and routes use
    endpoint: str  # the path after a base URL
    request: type[BaseModel]  # what the OpenAPI document says it takes
    tag: Literal["openai", "anthropic", "gemini"]
    handler: Callable[[ChatDoor, Settings], Serve]  # made once per process
    error_shape: ErrorShape = openai_error_of
    description: str = ""  # what the OpenAPI document says of it
    # the endpoint carries its API's own version and the model (Gemini's
    # `/v1beta/models/{model}:generateContent`): served under `paths.GEMINI_PREFIXES`
    own_version: bool = False


DOORS = (
    Door(
        "chat",
        "/chat/completions",
        ChatRequest,
        "openai",
        lambda chat, _: chat.chat,
        description="OpenAI Chat Completions, streamed or not: one Step per call.",
    ),
    Door(
        "completions",
        "/completions",
        CompletionsRequest,
        "openai",
        lambda chat, _: CompletionsDoor(chat).create,
        description="OpenAI (legacy) Completions, passed to the engines: a raw prompt is no conversation, so no Step and never trained.",
    ),
    Door(
        "responses",
        "/responses",
        ResponsesRequest,
        "openai",
        lambda chat, s: ResponsesDoor(chat, s.gateway.responses_store_size).create,
        description="OpenAI Responses (Codex), `previous_response_id` kept: one Step per call.",
    ),
    Door(
        "messages",
        "/messages",
        MessagesRequest,
        "anthropic",
        lambda chat, _: MessagesDoor(chat).create,
        anthropic_error_of,
        "Anthropic Messages (Claude Code), streamed or not: one Step per call.",
    ),
    Door(
        "count_tokens",
        "/messages/count_tokens",
        CountTokensRequest,
        "anthropic",
        lambda chat, _: MessagesDoor(chat).count_tokens,
        anthropic_error_of,
        "Anthropic's token count: the prompt's tokens as the engine's chat template renders the body; no Step.",
    ),
    Door(
        "gemini",
        "/v1beta/models/{model}:generateContent",
        GenerateContentRequest,
        "gemini",
        lambda chat, _: GeminiDoor(chat).generate,
        gemini_error_of,
        "Gemini's generateContent (Gemini CLI), the model in the path: one Step per call.",
        own_version=True,
    ),
    Door(
        "gemini_stream",
        "/v1beta/models/{model}:streamGenerateContent",
        GenerateContentRequest,
        "gemini",
        lambda chat, _: GeminiDoor(chat).stream,
        gemini_error_of,
        "Gemini's streamGenerateContent, `alt=sse` or a JSON array: one Step per call.",
        own_version=True,
    ),
    Door(
        "gemini_count_tokens",
        "/v1beta/models/{model}:countTokens",
        GeminiCountTokensRequest,
        "gemini",
        lambda chat, _: GeminiDoor(chat).count_tokens,
        gemini_error_of,
        "Gemini's token count: the prompt's tokens as the engine's chat template renders it; no Step.",
        own_version=True,
    ),
)
