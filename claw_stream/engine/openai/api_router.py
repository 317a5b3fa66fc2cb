"""The OpenAI-compatible routes. They take their handlers from `app.state` (set by
`server.create_app`), as vLLM's do, so a test can mount this router around fakes."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from claw_stream.engine.metrics import EngineMetrics
from claw_stream.engine.openai import protocol as p
from claw_stream.engine.openai.chat import ChatHandler
from claw_stream.engine.openai.completion import CompletionHandler
from claw_stream.engine.openai.models import ModelsHandler

router = APIRouter()


def models_handler(raw: Request) -> ModelsHandler:
    return raw.app.state.models_handler


def chat_handler(raw: Request) -> ChatHandler:
    return raw.app.state.chat_handler


def completion_handler(raw: Request) -> CompletionHandler:
    return raw.app.state.completion_handler


@router.get("/health")
async def health() -> Response:
    return Response(status_code=200)


@router.get("/metrics")
async def prometheus(raw: Request) -> Response:
    metrics: EngineMetrics = raw.app.state.metrics
    metrics.version.set(raw.app.state.core.version)
    core = raw.app.state.core
    metrics.sync(core.prefix_cache)
    metrics.sync_adapters(core.lora)
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models")
async def models(raw: Request) -> p.ModelList:
    return models_handler(raw).show_available_models()


@router.post("/tokenize")
async def tokenize(body: p.TokenizeRequest, raw: Request) -> p.TokenizeResponse:
    return models_handler(raw).tokenize(body)


@router.post("/v1/chat/completions")
async def chat(body: p.ChatCompletionRequest, raw: Request) -> Response:
    return await chat_handler(raw).create_chat_completion(body)


@router.post("/v1/completions")
async def completions(body: p.CompletionRequest, raw: Request) -> Response:
    return await completion_handler(raw).create_completion(body)
