"""A stand-in for a hosted OpenAI-compatible API (a model we cannot train): it demands its key,
refuses what the real one refuses (vLLM's `return_token_ids`), answers without token ids, and
keeps every request it was sent."""

from __future__ import annotations

import time
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from .app_thread import AppThread
from .processes import free_port

MODEL = "hosted-mini"


def _error(status: int, message: str, kind: str, code: str | None = None) -> JSONResponse:
    """OpenAI's error shape."""
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": code}}, status
    )


class HostedApi:
    def __init__(self, key: str, answer: str = "Here is a short answer."):
        self.key = key
        self.answer = answer
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.requests: list[dict[str, Any]] = []
        app = FastAPI()

        def refused(request: Request) -> JSONResponse | None:
            if request.headers.get("authorization") != f"Bearer {self.key}":
                return _error(
                    401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"
                )
            return None

        @app.get("/v1/models")
        async def models(request: Request) -> Any:
            return refused(request) or {
                "object": "list",
                "data": [{"id": MODEL, "object": "model"}],
            }

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            if (no := refused(request)) is not None:
                return no
            body = await request.json()
            self.requests.append(body)
            for field in ("return_token_ids", "prompt_logprobs"):
                if field in body:
                    return _error(
                        400,
                        f"Unrecognized request argument supplied: {field}",
                        "invalid_request_error",
                    )
            words = len(self.answer.split())
            usage = {"prompt_tokens": 9, "completion_tokens": words, "total_tokens": 9 + words}
            created = int(time.time())
            if not body.get("stream"):
                return {
                    "id": "chatcmpl-hosted",
                    "object": "chat.completion",
                    "created": created,
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": self.answer},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": usage,
                }

            def chunk(delta: dict[str, Any], finish: str | None, **more: Any) -> bytes:
                event = {
                    "id": "chatcmpl-hosted",
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": body["model"],
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                    **more,
                }
                return b"data: " + orjson.dumps(event) + b"\n\n"

            async def events() -> Any:
                yield chunk({"role": "assistant", "content": ""}, None)
                for word in self.answer.split(" "):
                    yield chunk({"content": word + " "}, None)
                yield chunk({}, "stop")
                if (body.get("stream_options") or {}).get("include_usage"):
                    yield (
                        b"data: "
                        + orjson.dumps(
                            {
                                "id": "chatcmpl-hosted",
                                "object": "chat.completion.chunk",
                                "created": created,
                                "model": body["model"],
                                "choices": [],
                                "usage": usage,
                            }
                        )
                        + b"\n\n"
                    )
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        self.served = AppThread(app, self.port)

    def stop(self) -> None:
        self.served.stop()
