"""The OpenAI-compatible routes. Handlers take their serving objects from `app.state` (set by
`server.create_app`), as vLLM's do, so a test can mount this router around fakes."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from claw_stream.engine import protocol as p
from claw_stream.engine.metrics import Metrics
from claw_stream.engine.serving_chat import ServingChat
from claw_stream.engine.serving_completion import ServingCompletion
from claw_stream.engine.serving_models import ServingModels

router = APIRouter()


def serving_models(raw: Request) -> ServingModels:
    return raw.app.state.serving_models


def serving_chat(raw: Request) -> ServingChat:
    return raw.app.state.serving_chat


def serving_completion(raw: Request) -> ServingCompletion:
    return raw.app.state.serving_completion


@router.get("/health")
async def health() -> Response:
    return Response(status_code=200)


@router.get("/metrics")
async def prometheus(raw: Request) -> Response:
    metrics: Metrics = raw.app.state.metrics
    metrics.version.set(raw.app.state.core.version)
    core = raw.app.state.core
    metrics.sync(core.prefix_cache)
    metrics.sync_adapters(core.lora)
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models")
async def models(raw: Request) -> p.ModelList:
    return serving_models(raw).show_available_models()


@router.post("/tokenize")
async def tokenize(body: p.TokenizeRequest, raw: Request) -> p.TokenizeResponse:
    return serving_models(raw).tokenize(body)


@router.post("/v1/chat/completions")
async def chat(body: p.ChatCompletionRequest, raw: Request) -> Response:
    return await serving_chat(raw).create_chat_completion(body)


@router.post("/v1/completions")
async def completions(body: p.CompletionRequest, raw: Request) -> Response:
    return await serving_completion(raw).create_completion(body)
