"""Anthropic's Messages API (`POST /v1/messages`), served through the chat path.

The request becomes a chat-completions body and goes through `ChatDoor.serve`: the same
session conventions (an Anthropic client's `x-api-key` is its key), bounds, engine and Step as
a chat call. The answer comes back as a Message or its stream events; every error in
Anthropic's shape. A Message's `id` is `msg_<step id>`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any, TypeVar

import orjson

from claw_stream.dialect import OpenAIError, anthropic_error_body, openai_error_message
from claw_stream.gateway.bodies import parse_body
from claw_stream.gateway.chat.door import ChatDoor, DoorAnswer
from claw_stream.gateway.messages.format import (
    MessagesStream,
    chat_body,
    content_blocks,
    message_object,
    stop_reason,
    usage_of,
)
from claw_stream.gateway.messages.protocol import (
    CountTokensRequest,
    CountTokensResponse,
    MessagesRequest,
)
from claw_stream.gateway.sessions.auth import session_names
from claw_stream.gateway.translate import Relay


class MessagesDoor:
    def __init__(self, chat: ChatDoor):
        self.chat = chat

    async def count_tokens(
        self,
        headers: Mapping[str, str],
        raw: bytes,
        path_session: str | None = None,
        path_group: str | None = None,
    ) -> DoorAnswer:
        """`POST /v1/messages/count_tokens`: the prompt's tokens as the engine's chat template
        renders the request (tools and reasoning settings included); no Step."""
        body, req, chat = _translated(raw, CountTokensRequest)
        named = session_names(headers, body.get("session_id"), path_session)
        caller, _ = await self.chat.auth.authorize(headers, "model_call", named)
        backend = self.chat.gateway.pool.choose(None, set())
        served = self.chat.names.resolve(req.model, self.chat.auth.tenant(caller, headers))
        count = await self.chat.bound.count(chat, backend, served) if backend else None
        if count is None:
            raise OpenAIError(503, "no inference backend can count tokens right now")
        answer = CountTokensResponse(input_tokens=count).model_dump_json().encode()
        return DoorAnswer(200, {"content-type": "application/json"}, answer)

    async def create(
        self,
        headers: Mapping[str, str],
        raw: bytes,
        path_session: str | None = None,
        path_group: str | None = None,
    ) -> DoorAnswer:
        started = time.perf_counter()
        body, req, chat = _translated(raw, MessagesRequest)
        answer = await self.chat.serve_translated(
            headers, chat, body, len(raw), path_session, path_group, started
        )
        if answer.status != 200:  # the engine's own error, in Anthropic's shape
            try:
                message, param = openai_error_message(orjson.loads(answer.body))
            except orjson.JSONDecodeError:
                message, param = "the inference backend refused the request", None
            answer.body = orjson.dumps(anthropic_error_body(answer.status, message, param))
            answer.headers["content-type"] = "application/json"
            return answer
        message_id = "msg_" + uuid.UUID(answer.headers["x-claw-step-id"]).hex
        if answer.chunks is None:
            completion = orjson.loads(answer.body)
            choice = completion["choices"][0]
            answer.body = orjson.dumps(
                message_object(
                    message_id,
                    req.model,
                    content_blocks(choice["message"]),
                    stop_reason(choice, req),
                    usage_of(completion.get("usage")),
                )
            )
            return answer
        answer.chunks = _events(answer.chunks, MessagesStream(req, message_id))
        return answer


Request = TypeVar("Request", bound=MessagesRequest)


def _translated(raw: bytes, model: type[Request]) -> tuple[dict[str, Any], Request, dict[str, Any]]:
    """The request's body, checked model and chat body; 400 for what cannot be translated."""
    body, req = parse_body(raw, model)
    try:
        return body, req, chat_body(req, body)
    except (ValueError, KeyError, TypeError) as exc:
        what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise OpenAIError(400, what) from None


async def _events(chunks: AsyncIterator[bytes], stream: MessagesStream) -> AsyncIterator[bytes]:
    try:
        yield stream.start()
        relay = Relay(stream.feed)
        async for out in relay.blocks(chunks):
            yield out
        if relay.failed is not None or stream.finish is None:
            # no Step was recorded for an answer that broke off: the client hears it
            why = relay.failed or "the inference backend's answer broke off"
            yield stream.error("api_error", why)
            return
        yield stream.end()
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
