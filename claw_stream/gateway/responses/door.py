"""The OpenAI Responses API (`POST /v1/responses`), served through the chat path.

The request becomes a chat-completions body and goes through `ChatDoor.serve`: the same
session conventions, bounds, engine and Step (exactly the sampled tokens) as a chat call. The
chat answer comes back as a Response, or as its stream events. A Response's `id` is
`resp_<step id>`: AReaL's `interaction_id` names the Step with it.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson

from claw_stream.dialect import ContextTooLong, OpenAIError
from claw_stream.gateway.bodies import parse_body
from claw_stream.gateway.chat.door import ChatDoor, DoorAnswer
from claw_stream.gateway.responses.format import (
    ResponsesStream,
    ToolMap,
    chat_body,
    input_messages,
    now,
    output_items,
    response_object,
    usage_of,
)
from claw_stream.gateway.responses.protocol import ResponsesRequest
from claw_stream.gateway.responses.store import ResponseStore
from claw_stream.gateway.sessions.auth import presented_key
from claw_stream.gateway.translate import Relay


class ResponsesDoor:
    def __init__(self, chat: ChatDoor, store_size: int):
        self.chat = chat
        self.store = ResponseStore(store_size)
        chat.gateway.on_forget.append(self.store.forget)

    async def create(
        self,
        headers: Mapping[str, str],
        raw: bytes,
        path_session: str | None = None,
        path_group: str | None = None,
    ) -> DoorAnswer:
        started = time.perf_counter()
        body, req = parse_body(raw, ResponsesRequest)
        conversation: list[dict[str, Any]] = []
        owner = key_digest(headers)
        if req.previous_response_id is not None:
            stored = self.store.get(req.previous_response_id)
            if stored is not None and not await self._may_continue(
                req.previous_response_id, owner, headers
            ):
                stored = None  # another session key's conversation: as good as unknown
            if stored is not None and await self._forgotten(req.previous_response_id):
                stored = None
            if stored is None:
                raise OpenAIError(
                    404,
                    f"Previous response with id '{req.previous_response_id}' not found.",
                    param="previous_response_id",
                )
            conversation = stored
        try:
            tools = ToolMap(req.tools)
            conversation += input_messages(req.input, tools)
            if not conversation:
                raise ValueError("input holds no message")
            system = [{"role": "system", "content": req.instructions}] if req.instructions else []
            chat = chat_body(req, body, system + conversation, tools)
        except (ValueError, KeyError, TypeError) as exc:
            what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            param = "tools" if str(exc).startswith("tools") else "input"
            raise OpenAIError(400, what, param=param) from None
        try:
            answer = await self.chat.serve_translated(
                headers, chat, body, len(raw), path_session, path_group, started
            )
        except ContextTooLong as exc:
            if not (req.stream and exc.prompt_overflows):
                raise
            # Codex knows a context overflow only as a stream's `response.failed` with this
            # code (then it compacts or tells the user); a 400 it takes for a broken request
            return _failed_stream(req, exc)
        if answer.status != 200:
            return answer  # the engine's own error, in OpenAI's shape already
        key = uuid.UUID(answer.headers["x-claw-step-id"]).hex
        response_id = f"resp_{key}"
        if answer.chunks is None:
            completion = orjson.loads(answer.body)
            choice = completion["choices"][0]
            message = choice["message"]
            response = response_object(
                req,
                response_id,
                completion.get("created") or now(),
                status="completed",
                output=output_items(message, key, tools, req.wants_encrypted_reasoning),
                usage=usage_of(completion.get("usage")),
                finish_reason=choice.get("finish_reason"),
            )
            if req.store:
                conversation = [*conversation, _assistant(message)]
                self.store.put(response_id, conversation, owner, answer.session_id)
            answer.body = orjson.dumps(response)
            return answer
        stream = ResponsesStream(req, response_id, key, tools)
        answer.chunks = self._events(answer.chunks, stream, conversation, owner, answer.session_id)
        return answer

    async def _forgotten(self, response_id: str) -> bool:
        """Whether the conversation's session was forgotten, maybe by another gateway process
        (the one that served the forget dropped its own copies at once): then it is dropped."""
        session_id = self.store.session_of(response_id)
        if session_id is None or not await self.chat.gateway.sessions.is_forgotten(session_id):
            return False
        self.store.forget([session_id])
        return True

    async def _may_continue(
        self, response_id: str, owner: str | None, headers: Mapping[str, str]
    ) -> bool:
        """A session key acts only on its own session: it continues only the conversations
        its own key created. Any other credential may name any session, so any conversation."""
        if self.store.owner(response_id) == owner:
            return True
        return (await self.chat.auth.caller(headers)).credential != "session"

    async def _events(
        self,
        chunks: AsyncIterator[bytes],
        stream: ResponsesStream,
        conversation: list[dict[str, Any]],
        owner: str | None,
        session_id: str | None,
    ) -> AsyncIterator[bytes]:
        try:
            yield stream.start()
            relay = Relay(stream.feed)
            async for out in relay.blocks(chunks):
                yield out
            if relay.failed is not None or stream.finish_reason is None:
                # no Step was recorded for an answer that broke off: the client hears it
                yield stream.fail(relay.failed or "the inference backend's answer broke off")
                return
            if stream.req.store:
                conversation = [*conversation, stream.assistant_message()]
                self.store.put(stream.response_id, conversation, owner, session_id)
            yield stream.finish()
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]


def _failed_stream(req: ResponsesRequest, exc: OpenAIError) -> DoorAnswer:
    """A stream that says at once that the request failed, as the real API's streams do."""
    stream = ResponsesStream(req, f"resp_{uuid.uuid4().hex}", uuid.uuid4().hex, ToolMap(None))

    async def events() -> AsyncIterator[bytes]:
        yield stream.start() + stream.fail(exc.message, exc.code or "invalid_request_error")

    return DoorAnswer(
        200, {"content-type": "text/event-stream", "cache-control": "no-cache"}, b"", events()
    )


def key_digest(headers: Mapping[str, str]) -> str | None:
    key = presented_key(headers)
    return hashlib.sha256(key.encode()).hexdigest() if key is not None else None


def _assistant(message: dict[str, Any]) -> dict[str, Any]:
    """The part of a chat answer's message the next request's prompt carries."""
    kept: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        kept["tool_calls"] = message["tool_calls"]
    return kept
