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

from claw_stream.dialect import OpenAIError, flatten_content
from claw_stream.gateway.upstreams import Backend, BackendPool

log = logging.getLogger(__name__)
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


def too_long(n_prompt: int, context: int, max_tokens: int | None, estimated: bool) -> str | None:
    """vLLM's words for a prompt that does not fit, or None when it fits."""
    has = f"at least {n_prompt}" if estimated else str(n_prompt)
    if n_prompt >= context:
        return (
            f"This model's maximum context length is {context} tokens. However, your request "
            f"has {has} input tokens. Please reduce the length of the input messages."
        )
    if max_tokens is not None and n_prompt + max_tokens > context:
        return (
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
            f"maximum context length is {context} tokens and your request has {has} input "
            f"tokens ({max_tokens} > {context} - {n_prompt})."
        )
    return None


class PromptBound:
    def __init__(self, pool: BackendPool, session: Callable[[], aiohttp.ClientSession | None]):
        self.pool = pool
        self.session = session

    async def check(self, body: Mapping[str, Any], size: int) -> None:
        """Refuse (400) a prompt that cannot fit the served context; `size` is the request's
        size in bytes."""
        context = self.pool.context_len()
        if context is None:
            return  # not known yet: the engine checks
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        max_tokens = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else None
        if isinstance(body.get("prompt"), list):  # a legacy completion's token ids: exact
            if message := too_long(len(body["prompt"]), context, max_tokens, estimated=False):
                raise OpenAIError(400, message, param="prompt")
            return
        param = "prompt" if "prompt" in body else "messages"
        if size / MIN_CHARS_PER_TOKEN + (max_tokens or 0) < context:
            return  # cannot reach the context (nearly every call)
        chars = prompt_chars(body)
        if chars / MIN_CHARS_PER_TOKEN + (max_tokens or 0) < context:
            return
        if chars / MAX_CHARS_PER_TOKEN >= context:
            message = too_long(int(chars / MAX_CHARS_PER_TOKEN), context, None, estimated=True)
            raise OpenAIError(400, message or "prompt too long", param=param)
        backend = self.pool.choose(None, set())
        n_prompt = await self._count(body, backend) if backend is not None else None
        if n_prompt is not None and (message := too_long(n_prompt, context, max_tokens, False)):
            raise OpenAIError(400, message, param=param)

    async def _count(self, body: Mapping[str, Any], backend: Backend) -> int | None:
        """The prompt's tokens by the engine's chat template (`/tokenize`); None when the
        engine cannot say (it then checks the request itself)."""
        session = self.session()
        if session is None:
            return None
        request: dict[str, Any] = {"model": body.get("model")}
        if isinstance(body.get("prompt"), str):
            request["prompt"] = body["prompt"]
        else:
            request.update(messages=body.get("messages"), tools=body.get("tools"))
            request["add_generation_prompt"] = True
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
