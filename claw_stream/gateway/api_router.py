"""The gateway's OpenAI routes as FastAPI declares them (models, chat), health and metrics.

POSTs to the chat paths are served by `FrontDoor` before FastAPI sees them; the route stays
declared here for the OpenAPI document and for any path the front door does not take.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess

from claw_stream.dialect import OpenAIError
from claw_stream.gateway.front_door import read_body
from claw_stream.gateway.protocol import ChatRequest
from claw_stream.gateway.service import Gateway
from claw_stream.gateway.serving_chat import ServingChat
from claw_stream.gateway.upstreams import RETRY_AFTER

router = APIRouter()
PREFIXES = ("", "/{session_id}", "/{session_id}/{group_id}")


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


@router.get("/healthz")
async def healthz(request: Request) -> dict[str, Any]:
    gateway = _gateway(request)
    return {
        **gateway.health(),
        "backends": [
            {"url": b.url, "healthy": b.healthy, "inflight": b.inflight}
            for b in gateway.pool.backends
        ],
    }


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    gateway = _gateway(request)
    registry = gateway.metrics.registry
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(gateway.spool_depth)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


async def models(request: Request) -> Response:
    gateway = _gateway(request)
    backend = gateway.pool.choose(None, set())
    if backend is None:
        raise OpenAIError(503, "no inference backend can answer right now", headers=RETRY_AFTER)
    try:
        r = await gateway.http.get(f"{backend.url}/v1/models", timeout=5)
    except httpx.HTTPError as exc:
        raise OpenAIError(503, f"backend unavailable: {exc}", headers=RETRY_AFTER) from None
    return Response(r.content, status_code=r.status_code, media_type="application/json")


async def chat(request: Request) -> Response:
    serving: ServingChat = request.app.state.serving_chat
    params = request.path_params
    answer = await serving.chat(
        request.headers,
        await read_body(request.headers, request.receive, serving.max_body),
        params.get("session_id"),
        params.get("group_id"),
    )
    if answer.chunks is not None:
        return StreamingResponse(answer.chunks, answer.status, answer.headers)
    return Response(answer.body, answer.status, answer.headers)


_CHAT_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": ChatRequest.model_json_schema()}},
    }
}
for _prefix in PREFIXES:
    router.add_api_route(f"{_prefix}/v1/models", models, methods=["GET"], tags=["openai"])
    router.add_api_route(
        f"{_prefix}/v1/chat/completions",
        chat,
        methods=["POST"],
        tags=["openai"],
        openapi_extra=_CHAT_BODY,
    )
