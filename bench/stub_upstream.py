"""A fast stand-in for vLLM's chat endpoint, for gateway benchmarks: same protocol, no model.

Answers every chat request with the same 16 tokens, including what the gateway captures
(`prompt_token_ids`, `choices[].token_ids`, logprobs), stream or not.
Run: python bench/stub_upstream.py PORT
"""

from __future__ import annotations

import functools
import json
import sys

from claw_stream.gateway.front_door import read_body

# compact, as vLLM writes it (FastAPI's JSONResponse, pydantic's model_dump_json)
dumps = functools.partial(json.dumps, separators=(",", ":"))
BODY_LIMIT = 64 * 1024 * 1024
N_TOKENS = 16
TOKENS = [f" tok{i}" for i in range(N_TOKENS)]
PROMPT_IDS = list(range(1, 2049))


def _logprob(token: str) -> dict:
    return {"token": token, "logprob": -0.25, "bytes": list(token.encode()), "top_logprobs": []}


NON_STREAM = dumps(
    {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 0,
        "model": "policy",
        "prompt_token_ids": PROMPT_IDS,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "".join(TOKENS)},
                "logprobs": {"content": [_logprob(t) for t in TOKENS]},
                "finish_reason": "stop",
                "token_ids": list(range(100, 100 + N_TOKENS)),
            }
        ],
        "usage": {
            "prompt_tokens": len(PROMPT_IDS),
            "completion_tokens": N_TOKENS,
            "total_tokens": len(PROMPT_IDS) + N_TOKENS,
        },
    }
).encode()


def _chunk(delta: dict, **extra: object) -> bytes:
    body = {
        "id": "chatcmpl-stub",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "policy",
    }
    body["choices"] = [{"index": 0, "delta": delta, **extra}]
    return b"data: " + dumps(body).encode() + b"\n\n"


STREAM = b"".join(
    [
        b"data: "
        + dumps(
            {
                "id": "chatcmpl-stub",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "policy",
                "prompt_token_ids": PROMPT_IDS,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
            }
        ).encode()
        + b"\n\n",
        *[
            _chunk({"content": t}, token_ids=[100 + i], logprobs={"content": [_logprob(t)]})
            for i, t in enumerate(TOKENS)
        ],
        _chunk({}, finish_reason="stop", token_ids=[]),
        b'data: {"id":"chatcmpl-stub","object":"chat.completion.chunk","created":0,"model":"policy","choices":[],"usage":{"prompt_tokens":2048,"completion_tokens":16,"total_tokens":2064}}\n\n',
        b"data: [DONE]\n\n",
    ]
)


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    body = await read_body({}, receive, BODY_LIMIT)
    if scope["path"].endswith("/health"):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    if scope["path"].endswith("/models"):
        payload = b'{"object":"list","data":[{"id":"policy","object":"model"}]}'
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": payload})
        return
    stream = b'"stream": true' in body or b'"stream":true' in body
    if stream:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": STREAM})
    else:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": NON_STREAM})


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
