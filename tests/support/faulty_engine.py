"""An engine that speaks the chat protocol but answers with what cannot make a Step: a
stream with a chunk whose logprobs are not objects, and a JSON answer with fewer logprobs than
tokens; and a stream that stalls after its first chunk (the last message says "stall")
until the client leaves. Serve it with `python -m uvicorn tests.support.faulty_engine:app --port P`."""

from __future__ import annotations

import json
from typing import Any

from claw_stream.gateway.front_door import read_body

BODY_LIMIT = 1024 * 1024
CHUNK = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "policy"}


def _event(value: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(value, separators=(",", ":")).encode() + b"\n\n"


STREAM = b"".join(
    [
        _event(CHUNK | {"prompt_token_ids": [1, 2], "choices": [{"index": 0, "delta": {}}]}),
        _event(
            CHUNK
            | {
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": "half"},
                        "token_ids": [7],
                        "logprobs": {"content": ["not an object"]},
                    }
                ]
            }
        ),
        _event(CHUNK | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        b"data: [DONE]\n\n",
    ]
)
ANSWER = json.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": "policy",
        "prompt_token_ids": [1, 2],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "two tokens"},
                "finish_reason": "stop",
                "token_ids": [7, 8],
                "logprobs": {"content": [{"token": "two", "logprob": -0.1}]},
            }
        ],
    }
).encode()


async def _stall(send: Any, receive: Any) -> None:
    """One chunk, then nothing until the client (the gateway) hangs up."""
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    first = CHUNK | {"prompt_token_ids": [1, 2], "choices": [{"index": 0, "delta": {}}]}
    await send({"type": "http.response.body", "body": _event(first), "more_body": True})
    while (await receive())["type"] != "http.disconnect":
        pass


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = await read_body({}, receive, BODY_LIMIT)
    if scope["path"].endswith("/chat/completions"):
        request = json.loads(body)
        stream = bool(request.get("stream"))
        if stream and request["messages"][-1].get("content") == "stall":
            await _stall(send, receive)
            return
        kind, payload = (b"text/event-stream", STREAM) if stream else (b"application/json", ANSWER)
    else:  # /health, /v1/models
        kind, payload = b"application/json", b'{"object":"list","data":[{"id":"policy"}]}'
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
    await send({"type": "http.response.body", "body": payload})
