"""HTTP front of the built-in engine: vLLM's OpenAI-compatible routes plus live weight loading.

The OpenAI-compatible API is `openai/` (laid out as vLLM's `vllm/entrypoints/openai/`), the
weight loading `admin`. `create_app` builds the API's handlers, keeps them on `app.state`
(where the routes find them) and mounts the routers (`openai.api_router`, `admin`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI

from claw_stream.engine import admin
from claw_stream.engine.arrivals import CountArrivals
from claw_stream.engine.core import EngineCore
from claw_stream.engine.metrics import EngineMetrics
from claw_stream.engine.openai import api_router
from claw_stream.engine.openai.chat import ChatHandler
from claw_stream.engine.openai.completion import CompletionHandler
from claw_stream.engine.openai.models import ModelsHandler
from claw_stream.http_errors import install_error_handlers


@dataclass
class EngineOptions:
    served_model_name: str
    admin_key: str | None = None
    default_max_tokens: int = 1024
    open_lora_routes: bool = False  # vLLM's LoRA routes take no key
    policy_name: str = "policy"  # whose newest adapter the served name means


def create_app(core: EngineCore, options: EngineOptions) -> FastAPI:
    app = FastAPI(title="claw-stream engine", version="1")
    install_error_handlers(app, validation_status=400)
    metrics = EngineMetrics()
    metrics.version.set(core.version)
    models = ModelsHandler(
        core, options.served_model_name, options.default_max_tokens, options.policy_name
    )
    app.state.core = core
    app.state.metrics = metrics
    app.state.admin_key = options.admin_key
    app.state.open_lora_routes = options.open_lora_routes
    app.state.models_handler = models
    app.state.chat_handler = ChatHandler(core, models, metrics)
    app.state.completion_handler = CompletionHandler(core, models, metrics)
    app.include_router(api_router.router)
    app.include_router(admin.router)
    app.add_middleware(CountArrivals, metrics=metrics)
    return app
