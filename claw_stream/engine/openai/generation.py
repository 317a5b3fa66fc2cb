"""What the chat and completion handlers share: one request's generation, its sampling
parameters, and the token text and logprob formatting of the answers."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from claw_stream.dialect import OpenAIError
from claw_stream.engine.chat_format import render_prompt
from claw_stream.engine.core import FinishEvent, GenerationParams, TokenEvent
from claw_stream.engine.core import Request as CoreRequest
from claw_stream.engine.openai import protocol as p

if TYPE_CHECKING:
    from claw_stream.engine.core import EngineCore
    from claw_stream.engine.metrics import EngineMetrics

LOGPROB_FLOOR = -9999.0  # vLLM clamps -inf to this


def clamp_logprob(x: float) -> float:
    return max(x, LOGPROB_FLOOR)


def token_text(tokenizer: Any, token_id: int) -> str:
    """The text of one token, as the logprob fields show it."""
    return tokenizer.decode([token_id])


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: Any,
    tool_choice: Any,
    template_kwargs: dict[str, Any] | None = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """The prompt ids of a chat; a message the template cannot render is the client's error."""
    try:
        return render_prompt(
            tokenizer, messages, tools, tool_choice, add_generation_prompt, template_kwargs
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise OpenAIError(
            400, f"cannot render messages with the chat template: {exc}", param="messages"
        ) from None


def generation_params(
    body: p.SamplingRequest,
    prompt_ids: list[int],
    max_tokens: int,
    adapter: str | None,
    *,
    top_logprobs: int,
    prompt_logprobs: int | None = None,
) -> GenerationParams:
    """OpenAI defaults: temperature 1 and top_p 1 when the client sets none."""
    return GenerationParams(
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
        stop_strings=body.stop_strings,
        top_logprobs=top_logprobs,
        prompt_logprobs=prompt_logprobs,
        adapter=adapter,
    )


class Generation:
    """Collects one request's events: tokens, versions, logprobs, then the finish."""

    def __init__(self, core_request: CoreRequest):
        self.request = core_request
        self.tokens: list[TokenEvent] = []
        self.finish: FinishEvent | None = None

    @classmethod
    def start(
        cls, core: EngineCore, metrics: EngineMetrics, params: GenerationParams
    ) -> Generation:
        """Submit `params` to the engine core; the events come back to the running loop."""
        request = CoreRequest(params, asyncio.get_running_loop())
        core.submit(request)
        metrics.prompt_tokens.inc(len(params.prompt_ids))
        return cls(request)

    async def next(self) -> TokenEvent | FinishEvent:
        event = await self.request.events.get()
        if isinstance(event, TokenEvent):
            self.tokens.append(event)
        else:
            self.finish = event
        return event

    async def run(self) -> FinishEvent:
        while self.finish is None:
            await self.next()
        return self.finish

    @property
    def token_ids(self) -> list[int]:
        return [t.token_id for t in self.tokens]

    @property
    def versions(self) -> list[int]:
        return [t.version for t in self.tokens]

    def weight_fields(self, fallback: int) -> tuple[int, list[int] | None]:
        versions = self.versions
        first = versions[0] if versions else fallback
        return first, (versions if len(set(versions)) > 1 else None)

    def usage(self, n_prompt: int) -> p.UsageInfo:
        return usage_of([self], n_prompt)


def start_choices(
    core: EngineCore, metrics: EngineMetrics, params: GenerationParams, n: int
) -> list[Generation]:
    """`n` generations of one prompt (vLLM's `n`): a seed, if given, is the first choice's and
    the next choices take the following seeds; the prefix cache lets the later choices reuse
    the first one's prefill."""
    return [
        Generation.start(
            core, metrics, params if params.seed is None else replace(params, seed=params.seed + i)
        )
        for i in range(n)
    ]


async def run_all(generations: list[Generation]) -> list[FinishEvent]:
    """Every choice's finish; on any failure or cancellation all of them are cancelled."""
    try:
        finishes = await asyncio.gather(*(g.run() for g in generations))
    except BaseException:
        for g in generations:
            g.request.cancelled = True
        raise
    for finish in finishes:
        raise_if_failed(finish)
    return list(finishes)


def usage_of(generations: list[Generation], n_prompt: int) -> p.UsageInfo:
    """The prompt counted once, as vLLM does for `n` choices; every choice's tokens."""
    completion = sum(len(g.tokens) for g in generations)
    cached = max(g.finish.cached_tokens if g.finish is not None else 0 for g in generations)
    return p.UsageInfo(
        prompt_tokens=n_prompt,
        completion_tokens=completion,
        total_tokens=n_prompt + completion,
        prompt_tokens_details=p.PromptTokenUsageInfo(cached_tokens=cached),
    )


def raise_if_failed(finish: FinishEvent) -> None:
    """A generation that failed before any text is an error answer (503 if its adapter went)."""
    if finish.error is not None and not finish.text:
        raise OpenAIError(
            503 if "unloaded" in finish.error else 500, f"generation failed: {finish.error}"
        )
