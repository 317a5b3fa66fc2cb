"""Bad or oversized requests cost the engines nothing: prompt-length bounds and per-key limits.

A prompt longer than the served context is refused with a 400 that names both lengths before
the engine prefills anything. Counting every prompt's tokens would cost the hot path more than
the rest of a call, so the request's size decides first: JSON text has at least as many bytes
as its characters, and no tokenizer packs fewer than MIN_CHARS_PER_TOKEN characters into a
token on prose, code or JSON, so a body that cannot reach the context passes at once (nearly
every call). A body so large that it cannot fit whatever the tokenizer (more than
MAX_CHARS_PER_TOKEN characters per token of context) is refused at once: a 5 MB prompt never
reaches an engine. Between the two, the engine's own `/tokenize` (vLLM has it too) counts
exactly: tokenising costs milliseconds, prefilling a prompt that will not fit would cost
seconds to minutes on CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import orjson

from claw_stream.dialect import ContextTooLong, OpenAIError, flatten_content
from claw_stream.gateway.upstreams import Backend, BackendPool

log = logging.getLogger(__name__)
# The most any hosted model gives in one answer (128k): agents ask for up to that whatever
# the model, and the real APIs refuse more, so a larger limit is the client's mistake
MAX_OUTPUT_TOKENS = 128_000
MIN_CHARS_PER_TOKEN = 2.5
MAX_CHARS_PER_TOKEN = 8.0


def prompt_chars(body: Mapping[str, Any]) -> int:
    """Characters of a request's text: a legacy completion's prompt, or a chat's message
    contents, tool calls and tool schemas."""
    prompt = body.get("prompt")
    chars = len(prompt) if isinstance(prompt, str) else 0
    for message in body.get("messages") or ():
        if not isinstance(message, dict):
            continue
        chars += len(flatten_content(message.get("content")))
        for call in message.get("tool_calls") or ():
            function = (call.get("function") or {}) if isinstance(call, dict) else {}
            chars += len(str(function.get("name", ""))) + len(str(function.get("arguments", "")))
    if body.get("tools"):
        chars += len(orjson.dumps(body["tools"]))
    return chars


def too_long(
    n_prompt: int, context: int, max_tokens: int | None, estimated: bool, param: str
) -> ContextTooLong | None:
    """vLLM's words for a prompt that does not fit, or None when it fits."""
    has = f"at least {n_prompt}" if estimated else str(n_prompt)
    if n_prompt >= context:
        return ContextTooLong(
            f"This model's maximum context length is {context} tokens. However, your request "
            f"has {has} input tokens. Please reduce the length of the input messages.",
            n_prompt,
            context,
            param,
        )
    if max_tokens is not None and n_prompt + max_tokens > context:
        return ContextTooLong(
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
            f"maximum context length is {context} tokens and your request has {has} input "
            f"tokens ({max_tokens} > {context} - {n_prompt}).",
            n_prompt,
            context,
            param,
        )
    return None


class PromptBound:
    def __init__(self, pool: BackendPool, session: Callable[[], aiohttp.ClientSession | None]):
        self.pool = pool
        self.session = session

    async def check(
        self,
        body: dict[str, Any],
        size: int,
        served_model: str | None = None,
        fit_max_tokens: bool = False,
    ) -> None:
        """Refuse (400) a prompt that cannot fit the served context; `size` is the request's
        size in bytes, `served_model` the engines' name for the model when not the client's.
        With `fit_max_tokens`, an answer limit larger than the room the prompt leaves is
        lowered to that room instead of refused: Claude Code asks for 32,000 tokens
        whatever the model, which the real API takes; beyond `MAX_OUTPUT_TOKENS` it is
        refused as the real APIs refuse it."""
        context = self.pool.context_len()
        if context is None:
            return  # not known yet: the engine checks
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        max_tokens = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else None
        if isinstance(body.get("prompt"), list):  # a legacy completion's token ids: exact
            if refused := too_long(len(body["prompt"]), context, max_tokens, False, "prompt"):
                raise refused
            return
        param = "prompt" if "prompt" in body else "messages"
        if size / MIN_CHARS_PER_TOKEN + (max_tokens or 0) < context:
            return  # cannot reach the context (nearly every call)
        chars = prompt_chars(body)
        if chars / MIN_CHARS_PER_TOKEN + (max_tokens or 0) < context:
            return
        if chars / MAX_CHARS_PER_TOKEN >= context:
            refused = too_long(int(chars / MAX_CHARS_PER_TOKEN), context, None, True, param)
            assert refused is not None
            raise refused
        backend = self.pool.choose(None, set())
        n_prompt = await self.count(body, backend, served_model) if backend else None
        if n_prompt is None:
            return
        if (
            fit_max_tokens
            and max_tokens is not None
            and max_tokens <= MAX_OUTPUT_TOKENS
            and n_prompt < context < n_prompt + max_tokens
        ):
            for name in ("max_tokens", "max_completion_tokens"):
                if name in body:
                    body[name] = context - n_prompt
            return
        if refused := too_long(n_prompt, context, max_tokens, False, param):
            raise refused

    async def count(
        self, body: Mapping[str, Any], backend: Backend, served_model: str | None = None
    ) -> int | None:
        """The prompt's tokens by the engine's chat template (`/tokenize`); None when the
        engine cannot say (it then checks the request itself)."""
        session = self.session()
        if session is None:
            return None
        request: dict[str, Any] = {"model": served_model or body.get("model")}
        if isinstance(body.get("prompt"), str):
            request["prompt"] = body["prompt"]
        else:
            request.update(messages=body.get("messages"), tools=body.get("tools"))
            request["add_generation_prompt"] = True
            if body.get("chat_template_kwargs"):
                request["chat_template_kwargs"] = body["chat_template_kwargs"]
        try:
            async with session.post(
                f"{backend.url}/tokenize",
                data=orjson.dumps(request),
                headers={"content-type": "application/json"},
            ) as response:
                if response.status != 200:
                    return None
                answer = orjson.loads(await response.read())
                count = answer.get("count")
                return count if isinstance(count, int) else None
        except (aiohttp.ClientError, OSError, TimeoutError, orjson.JSONDecodeError) as exc:
            log.debug("cannot count a prompt's tokens at %s: %s", backend.url, exc)
            return None


class KeyLimiter:
    """At most `limit` calls in flight per key (per gateway process); None: no limit."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self.inflight: dict[str, int] = {}

    def acquire(self, key: str | None) -> Callable[[], None]:
        """A release function; 429 with Retry-After when the key is at its limit."""
        if self.limit is None:
            return _nothing
        name = key or ""
        if self.inflight.get(name, 0) >= self.limit:
            raise OpenAIError(
                429,
                f"too many requests in flight for this key (limit {self.limit})",
                headers={"Retry-After": "1"},
            )
        self.inflight[name] = self.inflight.get(name, 0) + 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.inflight[name] -= 1
                if not self.inflight[name]:
                    del self.inflight[name]

        return release


def _nothing() -> None:
    return None
