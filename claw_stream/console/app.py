"""`claw-stream console` alone: the same pages and buttons as the gateway's /console, on their
own port (the buttons call the gateway named by console.gateway_url, or the settings')."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import RedirectResponse

from claw_stream.console.api_router import install
from claw_stream.console.service import Console
from claw_stream.settings import Settings


def create_app(settings: Settings) -> FastAPI:
    if settings.console.gateway_url is None:
        g = settings.gateway
        settings.console = settings.console.model_copy(
            update={"gateway_url": f"http://{g.host}:{g.port}"}
        )
    console = Console(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await console.start()
        try:
            yield
        finally:
            await console.stop()

    app = FastAPI(title="claw-stream console", lifespan=lifespan, docs_url=None, redoc_url=None)
    install(app, console)

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/console")

    return app
