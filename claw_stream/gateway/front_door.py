"""The model-call routes served as bare ASGI, in front of the FastAPI app that serves the rest.

Model calls are the gateway's hot path. FastAPI's per-request machinery (middleware stack,
exception-handler wrappers, dependency solving, a Request object) cost about a fifth of the
gateway's CPU per call in `bench/gateway_bench.py`, so `FrontDoor` hands POSTs to the model
APIs (chat, completions, Responses, Messages, Gemini, under every prefix of `paths.py`) straight
to their doors (`doors.py`). Every other request, the OpenAPI document included (where those routes
stay declared), goes to FastAPI.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

import orjson

from claw_stream.dialect import OpenAIError, error_body, openai_error_of
from claw_stream.gateway.chat.door import DONE, ChatDoor, DoorAnswer
from claw_stream.gateway.doors import ErrorShape, Serve
from claw_stream.gateway.paths import route
from claw_stream.gateway.sessions.outage import unavailable

log = logging.getLogger(__name__)
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Handler:
    """One model API at the front door: how it serves a call, how its errors look."""

    def __init__(self, serve: Serve, error_shape: ErrorShape = openai_error_of):
        self.serve = serve
        self.error_shape = error_shape


class ClientGone(Exception):
    """The client disconnected before its request body arrived, or during its stream."""


async def read_body(headers: Mapping[str, str], receive: Receive, limit: int) -> bytes:
    """A request's body, refused with 413 once it is larger than `limit` bytes."""
    length = headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise OpenAIError(413, f"request body larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise OpenAIError(413, f"request body larger than {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _declared_length(scope: Scope) -> int | None:
    """The request's Content-Length; None when it has none (a chunked upload)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else 0
    return None


def _header_list(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


class FrontDoor:
    def __init__(self, app: ASGIApp, chat: ChatDoor, doors: dict[str, Handler]):
        self.app = app
        self.chat = chat  # its body limit, metrics and outage apply to every door
        self.doors = doors  # by API name (doors.py)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = route(scope["path"])
            if match is not None and match.api in self.doors:
                try:
                    await self.call(
                        match.api, scope, receive, send, match.session_id, match.group_id
                    )
                except asyncio.CancelledError:
                    await self._ended_by_shutdown(match.api, send)
                return
            declared = _declared_length(scope)
            if declared is None:  # chunked: counted as it arrives, then handed on whole
                replay = await self._bounded(receive, send)
                if replay is None:
                    return
                receive = replay
            elif declared > self.chat.max_body:  # refused before it is read
                body = error_body(413, f"request body larger than {self.chat.max_body} bytes")
                await self._send_whole(send, 413, {}, orjson.dumps(body))
                return
        await self.app(scope, receive, send)

    async def _bounded(self, receive: Receive, send: Send) -> Receive | None:
        """A body of undeclared length read whole under the limit, and a `receive` that gives
        it to the app; None when the request was answered (413) or the client left."""
        try:
            raw = await read_body({}, receive, self.chat.max_body)
        except ClientGone:
            return None
        except OpenAIError as exc:
            body = error_body(exc.status, exc.message, exc.param)
            await self._send_whole(send, exc.status, exc.headers, orjson.dumps(body))
            return None
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if delivered:
                return await receive()  # the client's hang-up, for a streaming answer
            delivered = True
            return {"type": "http.request", "body": raw, "more_body": False}

        return replay

    async def call(
        self,
        api: str,
        scope: Scope,
        receive: Receive,
        send: Send,
        session: str | None,
        group: str | None,
    ) -> None:
        door = self.doors[api]
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        # the request line, as HTTP/2's pseudo-header: Gemini's names the model and the key
        query = scope.get("query_string")
        headers[":path"] = scope["path"] + ("?" + query.decode("latin-1") if query else "")
        try:
            raw = await read_body(headers, receive, self.chat.max_body)
            answer = await door.serve(headers, raw, session, group)
        except ClientGone:
            return
        except OpenAIError as exc:
            self.chat.metrics.requests.labels(api, str(exc.status)).inc()
            body = door.error_shape(exc)
            await self._send_whole(send, exc.status, exc.headers, orjson.dumps(body))
            return
        except Exception as exc:
            if self.chat.gateway.sessions.outage.caught(exc):  # a call that needs Postgres
                log.warning("%s request needs Postgres, which is away: %r", api, exc)
                refused = unavailable("this request")
                self.chat.metrics.requests.labels(api, "503").inc()
                body = door.error_shape(refused)
                await self._send_whole(send, 503, refused.headers, orjson.dumps(body))
                return
            log.exception("%s request failed", api)
            self.chat.metrics.requests.labels(api, "500").inc()
            body = door.error_shape(
                OpenAIError(500, f"internal error: {type(exc).__name__}: {exc}")
            )
            await self._send_whole(send, 500, {}, orjson.dumps(body))
            return
        if answer.chunks is None:
            await self._send_whole(send, answer.status, answer.headers, answer.body)
        else:
            await self._stream(answer, receive, send)

    async def _ended_by_shutdown(self, api: str, send: Send) -> None:
        """uvicorn cancels the calls still open `timeout_graceful_shutdown` into a shutdown (an
        engine answering slowly on the CPU) and logs each as "Exception in ASGI application"
        with a traceback: a stop of `claw-stream up` under traffic logged several. Nothing
        else cancels a call's task (a client's hang-up ends a relay without a cancellation
        escaping it), so the call ends here: 503 to a client that has no answer yet, one line
        in the log."""
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        log.warning("a %s call was still open when the gateway stopped: ended (503)", api)
        self.chat.metrics.requests.labels(api, "503").inc()
        refused = OpenAIError(503, "the gateway is shutting down", headers={"retry-after": "1"})
        body = self.doors[api].error_shape(refused)
        with contextlib.suppress(Exception):  # the answer may have begun: nothing to add then
            await self._send_whole(send, 503, refused.headers, orjson.dumps(body))

    @staticmethod
    async def _send_whole(send: Send, status: int, headers: dict[str, str], body: bytes) -> None:
        start = _header_list({"content-type": "application/json", **headers})
        start.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": start})
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    async def _stream(answer: DoorAnswer, receive: Receive, send: Send) -> None:
        """Relay the chunks; a client that hangs up stops the relay's waits for the engine."""
        assert answer.chunks is not None
        chunks = answer.chunks
        relaying = asyncio.current_task()
        assert relaying is not None
        answer.waiting = watch = HangUpWatch(receive, relaying)
        start = {
            "type": "http.response.start",
            "status": answer.status,
            "headers": _header_list(answer.headers),
        }
        try:
            # the headers leave with the first chunk: one wake-up of the client, not two
            async for chunk in chunks:
                if start:
                    await send(start)
                    start = {}
                last = chunk.endswith(DONE)  # nothing follows it: end the body in the same write
                await send({"type": "http.response.body", "body": chunk, "more_body": not last})
                if last:
                    return
            if start:
                await send(start)
            await send({"type": "http.response.body", "body": b""})
        except ClientGone:
            pass
        except asyncio.CancelledError:
            if not watch.left:
                raise
            relaying.uncancel()  # the client left: nothing else asked this task to stop
        finally:
            await watch.stop()
            with contextlib.suppress(Exception):
                await chunks.aclose()  # type: ignore[attr-defined]


class HangUpWatch:
    """Makes a client's hang-up cancel a stream's relay while it waits for the engine (inside
    `with watch:`), so the engine stops working for nobody.

    The client is watched from the relay's first wait on: an answer that arrived whole needs
    no watcher. A hang-up outside the waits, while the Step is being recorded, cancels nothing;
    the relay's next wait ends it instead.
    """

    def __init__(self, receive: Receive, relaying: asyncio.Task[Any]):
        self.receive = receive
        self.relaying = relaying
        self.left = False
        self._waiting = False
        self._listening: asyncio.Future[None] | None = None

    def __enter__(self) -> None:
        if self.left:
            raise ClientGone
        self._waiting = True
        if self._listening is None:
            self._listening = asyncio.ensure_future(self._listen())

    def __exit__(self, *exc: object) -> None:
        self._waiting = False

    async def _listen(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass
        self.left = True
        if self._waiting:
            self.relaying.cancel()

    async def stop(self) -> None:
        if self._listening is not None:
            self._listening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listening
