"""HTTP front of the built-in engine: vLLM's OpenAI-compatible routes plus live weight loading.

Laid out as vLLM's `vllm/entrypoints/openai/`: `protocol` (wire models), one serving class per
API (`serving_models`, `serving_chat`, `serving_completion`), the routers (`api_router`,
`admin`). `create_app` builds the serving objects, keeps them on `app.state` (where the route
handlers find them) and mounts the routers.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI

from claw_stream.dialect import install_error_handlers
from claw_stream.engine import admin, api_router
from claw_stream.engine.arrivals import CountArrivals
from claw_stream.engine.core import EngineCore
from claw_stream.engine.metrics import Metrics
from claw_stream.engine.serving_chat import ServingChat
from claw_stream.engine.serving_completion import ServingCompletion
from claw_stream.engine.serving_models import ServingModels


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
    metrics = Metrics()
    metrics.version.set(core.version)
    models = ServingModels(
        core, options.served_model_name, options.default_max_tokens, options.policy_name
    )
    app.state.core = core
    app.state.metrics = metrics
    app.state.admin_key = options.admin_key
    app.state.open_lora_routes = options.open_lora_routes
    app.state.serving_models = models
    app.state.serving_chat = ServingChat(core, models, metrics)
    app.state.serving_completion = ServingCompletion(core, models, metrics)
    app.include_router(api_router.router)
    app.include_router(admin.router)
    app.add_middleware(CountArrivals, metrics=metrics)
    return app
