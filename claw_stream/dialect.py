"""The wire dialects the HTTP services speak: errors, content.

Errors are OpenAI-shaped (`{"error": {"message", "type", "param", "code"}}`) in every app,
except on the gateway's Anthropic Messages route, which answers in Anthropic's shape
(`{"type": "error", "error": {"type", "message"}}`), and its Gemini routes, in Google's
(`{"error": {"code", "message", "status"}}`). The shapes only: the apps' handlers that
answer with them are `http_errors.py` (FastAPI).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    409: "ConflictError",
    413: "RequestTooLargeError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
}


class OpenAIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers or {}
        self.code = code  # OpenAI's machine-readable code, where it has one


class ContextTooLong(OpenAIError):
    """A prompt that does not fit the served context, which each client's API words its own
    way: OpenAI's `context_length_exceeded` (Codex and the openai SDK act on the code) and
    Anthropic's "prompt is too long: N tokens > M maximum" (Claude Code acts on the words)."""

    def __init__(self, message: str, n_prompt: int, context: int, param: str | None = None):
        # only the prompt itself overflowing is `context_length_exceeded`; an answer limit
        # too large for the room left is a plain 400, in vLLM's words
        code = "context_length_exceeded" if n_prompt >= context else None
        super().__init__(400, message, param=param, code=code)
        self.n_prompt = n_prompt
        self.context = context

    @property
    def prompt_overflows(self) -> bool:
        return self.n_prompt >= self.context


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict:
    kind = _TYPES.get(status, "InternalServerError" if status >= 500 else HTTPStatus(status).phrase)
    return {"error": {"message": message, "type": kind, "param": param, "code": code or status}}


def openai_error_of(exc: OpenAIError) -> dict:
    return error_body(exc.status, exc.message, exc.param, exc.code)


_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_error_body(status: int, message: str, param: str | None = None) -> dict:
    """An error as Anthropic's API sends it; `param` (which field) goes into the message."""
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    if param and param not in message:
        message = f"{param}: {message}"
    return {"type": "error", "error": {"type": kind, "message": message}}


def anthropic_error_of(exc: OpenAIError) -> dict:
    if isinstance(exc, ContextTooLong) and exc.prompt_overflows:
        message = f"prompt is too long: {exc.n_prompt} tokens > {exc.context} maximum"
        return anthropic_error_body(exc.status, message)
    return anthropic_error_body(exc.status, exc.message, exc.param)


# Google's status names (google.rpc.Code) by HTTP status, as the Gemini API answers
_GEMINI_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    422: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def gemini_error_body(status: int, message: str, param: str | None = None) -> dict:
    """An error as the Gemini API sends it (`{"error": {"code", "message", "status"}}`);
    `param` (which field) goes into the message."""
    kind = _GEMINI_STATUSES.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")
    if param and param not in message:
        message = f"{param}: {message}"
    return {"error": {"code": status, "message": message, "status": kind}}


def gemini_error_of(exc: OpenAIError) -> dict:
    """Gemini's shape; a prompt that does not fit in the Gemini API's own words (Gemini CLI
    shows them; it decides on compression by its own count, see docs/agents/gemini-cli.md)."""
    if isinstance(exc, ContextTooLong) and exc.prompt_overflows:
        message = (
            f"The input token count ({exc.n_prompt}) exceeds the maximum number of tokens "
            f"allowed ({exc.context})."
        )
        return gemini_error_body(exc.status, message)
    return gemini_error_body(exc.status, exc.message, exc.param)


def openai_error_message(body: Any) -> tuple[str, str | None]:
    """The message and param of an OpenAI-shaped error body (parsed), or a stand-in."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        param = error.get("param")
        return str(error.get("message") or "error"), param if isinstance(param, str) else None
    return "the inference backend refused the request", None


def flatten_content(content: Any) -> str:
    """OpenAI content (a string, or a list of parts) as plain text; non-text parts are dropped."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("text", "input_text"):
                texts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                texts.append(part)
        return "\n".join(texts)
    raise ValueError("message content must be a string or a list of content parts")
