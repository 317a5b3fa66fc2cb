"""The HTTP apps' error handlers (FastAPI): every error leaves an app in OpenAI's shape
(`dialect.py` holds the shapes, free of any web framework, as the contract is)."""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from claw_stream.dialect import OpenAIError, error_body, openai_error_of

log = logging.getLogger(__name__)


def error_response(
    status: int, message: str, param: str | None = None, **kw: object
) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status, **kw)  # type: ignore[arg-type]


def _describe(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return (
            f"request body is not valid JSON: {first.get('ctx', {}).get('error', '')}".strip(),
            None,
        )
    parts, param = [], None
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        where = ".".join(loc) or "body"
        param = param or where
        parts.append(f"{where}: {err.get('msg')}")
    return "; ".join(parts), param


def install_error_handlers(app: FastAPI, *, validation_status: int = 400) -> None:
    """Every error leaves the app in OpenAI's shape; invalid JSON is always 400."""

    @app.exception_handler(OpenAIError)
    async def _openai(_: Request, exc: OpenAIError) -> JSONResponse:
        return JSONResponse(openai_error_of(exc), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _describe(exc)
        is_json = any(e.get("type") == "json_invalid" for e in exc.errors())
        return error_response(400 if is_json else validation_status, message, param)

    @app.exception_handler(json.JSONDecodeError)
    async def _json(_: Request, exc: json.JSONDecodeError) -> JSONResponse:
        return error_response(400, f"request body is not valid JSON: {exc}")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(
            exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None)
        )

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")
