"""Legacy completions (`POST /v1/completions`), passed through to the engines.

A raw prompt is no conversation: the Step contract (messages, a main line to stitch) cannot
hold it, so these calls are served (same keys, sessions' authorization and model names as
chat) but record no Step and are never trained on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp
import orjson

from claw_stream.dialect import OpenAIError
from claw_stream.gateway.bodies import read_object
from claw_stream.gateway.chat.door import ChatDoor, DoorAnswer
from claw_stream.gateway.protocol import SESSION_FIELDS
from claw_stream.gateway.sessions.auth import presented_key, session_names
from claw_stream.gateway.upstreams import Backend, read_whole


class CompletionsDoor:
    def __init__(self, chat: ChatDoor):
        self.chat = chat

    async def create(
        self,
        headers: Mapping[str, str],
        raw: bytes,
        path_session: str | None = None,
        path_group: str | None = None,
    ) -> DoorAnswer:
        body = read_object(raw)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise OpenAIError(422, "model: a model name is required", param="model")
        named = session_names(headers, body.get("session_id"), path_session)
        caller, session_id = await self.chat.auth.authorize(headers, "model_call", named)
        for name in SESSION_FIELDS:
            body.pop(name, None)
        body["model"] = self.chat.names.resolve(model, self.chat.auth.tenant(caller, headers))
        await self.chat.bound.check(body, len(raw))
        release = self.chat.limiter.acquire(presented_key(headers))
        try:
            return await self._answer(body, session_id, model, release)
        except BaseException:
            release()
            raise

    async def _answer(
        self, body: dict[str, Any], session_id: str | None, model: str, release: Callable[[], None]
    ) -> DoorAnswer:
        backend, response = await self.chat.upstream.send(
            orjson.dumps(body), session_id or "completions", "/v1/completions"
        )
        if body.get("stream") and response.status == 200:
            answer = DoorAnswer(
                200, {"content-type": "text/event-stream", "cache-control": "no-cache"}
            )
            answer.chunks = _relay(response, backend, answer, release)
            return answer
        try:
            content = await read_whole(backend, response)
        finally:
            release()
        if response.status == 200:
            content = _renamed(content, model)
        return DoorAnswer(response.status, {"content-type": "application/json"}, content)


def _renamed(content: bytes, model: str) -> bytes:
    """The engine's answer under the name the client asked for."""
    try:
        answer: Any = orjson.loads(content)
    except orjson.JSONDecodeError:
        return content
    if isinstance(answer, dict):
        answer["model"] = model
        return orjson.dumps(answer)
    return content


async def _relay(
    response: aiohttp.ClientResponse,
    backend: Backend,
    answer: DoorAnswer,
    release: Callable[[], None],
) -> AsyncIterator[bytes]:
    try:
        while True:
            with answer.waiting:
                block = await response.content.readany()
            if not block:
                return
            yield block
    except (aiohttp.ClientError, OSError, TimeoutError):
        return
    finally:
        backend.inflight -= 1
        response.release()
        release()
