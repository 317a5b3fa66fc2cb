"""The Gemini API (`POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent`,
`:countTokens`), served through the chat path.

The request becomes a chat-completions body and goes through `ChatDoor.serve_translated`: the
same session conventions, bounds, engine and Step as a chat call. The model is the path's; the
key is `x-goog-api-key` or the `key` query parameter (as Google's SDKs send it). The answer
comes back as a `GenerateContentResponse`, or its stream (`alt=sse`: server-sent events, else
one JSON array written as it grows); every error in Google's shape. A response's `responseId` is
its Step's id.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import parse_qs

import orjson

from claw_stream.dialect import OpenAIError, gemini_error_body, openai_error_message
from claw_stream.gateway.bodies import parse_body
from claw_stream.gateway.chat.door import ChatDoor, DoorAnswer
from claw_stream.gateway.gemini.format import (
    GeminiStream,
    chat_body,
    chat_messages,
    chat_tools,
    finish_reason,
    includes_thoughts,
    parts_of,
    reasoning_settings,
    response_object,
    usage_metadata,
)
from claw_stream.gateway.gemini.protocol import (
    GeminiCountTokensRequest,
    GeminiCountTokensResponse,
    GenerateContentRequest,
    model_and_method,
)
from claw_stream.gateway.sessions.auth import session_names
from claw_stream.gateway.translate import Relay

KEY_HEADER = "x-goog-api-key"


def request_line(headers: Mapping[str, str]) -> tuple[str, dict[str, str], dict[str, str]]:
    """The model a call names in its path, its query parameters, and its headers with the
    `key` parameter as `x-goog-api-key` (where the header is not there already)."""
    path, _, query = headers.get(":path", "").partition("?")
    named = model_and_method(path)
    if named is None:
        raise OpenAIError(404, f"no Gemini model method in {path!r}")
    params = {k: v[-1] for k, v in parse_qs(query).items()}
    if params.get("key") and not headers.get(KEY_HEADER):
        headers = {**headers, KEY_HEADER: params["key"]}
    return named[0], params, dict(headers)


class GeminiDoor:
    def __init__(self, chat: ChatDoor):
        self.chat = chat

    async def generate(
        self,
        headers: Mapping[str, str],
        raw: bytes,
        path_session: str | None = None,
        path_group: str | None = None,
    ) -> DoorAnswer:
        """`:generateContent`: the whole answer."""
        return await self._serve(headers, raw, path_session, path_group, stream=False)

    async def stream(
        self,
        headers: Mapping[str, str],
        raw: bytes,
        path_session: str | None = None,
        path_group: str | None = None,
    ) -> DoorAnswer:
        """`:streamGenerateContent`: the answer as it is sampled."""
        return await self._serve(headers, raw, path_session, path_group, stream=True)

    async def _serve(
        self,
        headers: Mapping[str, str],
        raw: bytes,
        path_session: str | None,
        path_group: str | None,
        stream: bool,
    ) -> DoorAnswer:
        started = time.perf_counter()
        model, params, headers = request_line(headers)
        body, req = parse_body(raw, GenerateContentRequest)
        try:
            chat = chat_body(req, body, model, stream)
        except (ValueError, KeyError, TypeError) as exc:
            raise OpenAIError(400, str(exc)) from None
        answer = await self.chat.serve_translated(
            headers, chat, body, len(raw), path_session, path_group, started
        )
        if answer.status != 200:  # the engine's own error, in Google's shape
            try:
                message, param = openai_error_message(orjson.loads(answer.body))
            except orjson.JSONDecodeError:
                message, param = "the inference backend refused the request", None
            answer.body = orjson.dumps(gemini_error_body(answer.status, message, param))
            answer.headers["content-type"] = "application/json"
            return answer
        response_id = uuid.UUID(answer.headers["x-claw-step-id"]).hex
        thoughts = includes_thoughts(req)
        if answer.chunks is None:
            completion = orjson.loads(answer.body)
            choice = completion["choices"][0]
            answer.body = orjson.dumps(
                response_object(
                    response_id,
                    model,
                    parts_of(choice["message"], thoughts),
                    finish_reason(choice),
                    usage_metadata(completion.get("usage")),
                )
            )
            return answer
        sse = params.get("alt") == "sse"
        answer.headers["content-type"] = "text/event-stream" if sse else "application/json"
        answer.chunks = _events(answer.chunks, GeminiStream(response_id, model, thoughts, sse))
        return answer

    async def count_tokens(
        self,
        headers: Mapping[str, str],
        raw: bytes,
        path_session: str | None = None,
        path_group: str | None = None,
    ) -> DoorAnswer:
        """`:countTokens`: the prompt's tokens as the engine's chat template renders the
        contents (with the system instruction and tools of a whole `generateContentRequest`);
        no Step."""
        model, _, headers = request_line(headers)
        body, req = parse_body(raw, GeminiCountTokensRequest)
        whole = req.generate_content_request
        if whole is None and not req.contents:
            raise OpenAIError(400, "contents or generateContentRequest is required")
        try:
            if whole is None:
                whole = GenerateContentRequest(contents=req.contents or [])
            chat: dict[str, Any] = {"model": model, "messages": chat_messages(whole)}
            tools, _ = chat_tools(whole.tools)
            if tools:
                chat["tools"] = tools
            config = whole.generation_config
            chat.update(reasoning_settings(config.thinking_config if config else None))
        except (ValueError, KeyError, TypeError) as exc:
            raise OpenAIError(400, str(exc)) from None
        named = session_names(headers, body.get("session_id"), path_session)
        caller, _ = await self.chat.auth.authorize(headers, "model_call", named)
        backend = self.chat.gateway.pool.choose(None, set())
        served = self.chat.names.resolve(model, self.chat.auth.tenant(caller, headers))
        count = await self.chat.bound.count(chat, backend, served) if backend else None
        if count is None:
            raise OpenAIError(503, "no inference backend can count tokens right now")
        answer = (
            GeminiCountTokensResponse(total_tokens=count).model_dump_json(by_alias=True).encode()
        )
        return DoorAnswer(200, {"content-type": "application/json"}, answer)


async def _events(chunks: AsyncIterator[bytes], stream: GeminiStream) -> AsyncIterator[bytes]:
    try:
        relay = Relay(stream.feed)
        async for out in relay.blocks(chunks):
            yield out
        if relay.failed is not None or stream.finish is None:
            # no Step was recorded for an answer that broke off: the client hears it
            why = relay.failed or "the inference backend's answer broke off"
            yield stream.error(500, why, "INTERNAL")
            return
        yield stream.end()
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
