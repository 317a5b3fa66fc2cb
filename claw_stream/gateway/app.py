"""The gateway's ASGI app: the model calls straight to their doors, the rest FastAPI.

service.py        the gateway's parts and their lifecycle
paths.py          which API a path names, under which prefix (root, /v1, /{session}/{group}/...)
doors.py          the model APIs, one line each; front_door.py serves them as bare ASGI
model_names.py    which model the engines serve a call with, whatever name the client sent
chat/             chat completions: the engine's answer out, one Step recorded
completions/      legacy completions, passed through (a raw prompt makes no Step)
responses/, messages/, gemini/
                  OpenAI Responses, Anthropic Messages and the Gemini API, translated to and
                  from the chat path
sessions/         credentials and sessions (auth, authz: one decision), main lines, bounds,
                  the session API (/rl/*)
delivery/         publisher (acks=all) and spool, the journal of unarchived steps, the check
api_router.py     the model routes as declared, health, metrics
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError

from claw_stream.console.api_router import install as install_console
from claw_stream.console.service import Console
from claw_stream.dialect import openai_error_of
from claw_stream.gateway import api_router, skills_routes
from claw_stream.gateway.chat.door import ChatDoor
from claw_stream.gateway.doors import DOORS
from claw_stream.gateway.front_door import FrontDoor, Handler
from claw_stream.gateway.service import Gateway
from claw_stream.gateway.sessions import rl_routes
from claw_stream.gateway.sessions.outage import unavailable
from claw_stream.http_errors import error_response, install_error_handlers
from claw_stream.settings import Settings
from claw_stream.store.db import DATABASE_DOWN

log = logging.getLogger(__name__)

SETTINGS_ENV = "CLAWSTREAM_GATEWAY_SETTINGS"  # what `gateway --workers N` hands its processes


def create_app(settings: Settings) -> FrontDoor:
    gateway = Gateway(settings)
    chat_door = ChatDoor(gateway)
    doors = {
        door.api: Handler(door.handler(chat_door, settings), door.error_shape) for door in DOORS
    }

    # the console reads the lag the gateway reads already for /metrics
    console = Console(settings, gateway.lag) if settings.console.enabled else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        if console is not None:
            await console.start()
        try:
            yield
        finally:
            if console is not None:
                await console.stop()
            await gateway.stop()

    app = FastAPI(title="claw-stream gateway", version="1", lifespan=lifespan)
    app.state.gateway = gateway
    app.state.chat_door = chat_door
    install_error_handlers(app, validation_status=422)
    install_outage_handlers(app, gateway)
    app.include_router(api_router.router)
    app.include_router(rl_routes.router)
    app.include_router(skills_routes.router)
    if console is not None:
        install_console(app, console)
    return FrontDoor(app, chat_door, doors)


def install_outage_handlers(app: FastAPI, gateway: Gateway) -> None:
    """A route that needs Postgres while it is away answers 503 with Retry-After (a line in
    the log, no traceback); anything else unexpected stays a 500."""

    async def refused(request: Request, exc: Exception) -> JSONResponse:
        if not gateway.sessions.outage.caught(exc):
            log.error("unhandled error on %s", request.url.path, exc_info=exc)
            return error_response(500, f"internal error: {type(exc).__name__}: {exc}")
        log.warning("%s needs Postgres, which is away: %r", request.url.path, exc)
        error = unavailable(request.url.path)
        return JSONResponse(openai_error_of(error), 503, headers=error.headers)

    for kind in (*DATABASE_DOWN, DBAPIError):
        app.add_exception_handler(kind, refused)


def app_from_environment() -> FrontDoor:
    """The app of one process of `claw-stream gateway --workers N` (a uvicorn factory)."""
    return create_app(Settings.model_validate_json(os.environ[SETTINGS_ENV]))
