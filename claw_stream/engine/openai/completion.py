"""`/v1/completions`: text or token ids in, vLLM's logprobs and prompt logprobs out (no streaming)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse, Response

from claw_stream.dialect import OpenAIError
from claw_stream.engine.openai import protocol as p
from claw_stream.engine.openai.generation import (
    Generation,
    clamp_logprob,
    generation_params,
    run_all,
    start_choices,
    token_text,
    usage_of,
)
from claw_stream.names import VERSION_HEADER

if TYPE_CHECKING:
    from claw_stream.engine.core import EngineCore
    from claw_stream.engine.metrics import EngineMetrics
    from claw_stream.engine.openai.models import ModelsHandler


def completion_logprobs(
    tokenizer: Any, generation: Generation, offset: int
) -> p.CompletionLogProbs:
    """The legacy completions logprobs; `offset` is where the generated text starts."""
    logprobs = p.CompletionLogProbs()
    for e in generation.tokens:
        token = token_text(tokenizer, e.token_id)
        logprobs.text_offset.append(offset)
        logprobs.tokens.append(token)
        logprobs.token_logprobs.append(clamp_logprob(e.logprob))
        tops = {token_text(tokenizer, t): clamp_logprob(lp) for t, lp in e.top}
        tops.setdefault(token, clamp_logprob(e.logprob))
        logprobs.top_logprobs.append(tops)
        offset += len(token)
    return logprobs


def prompt_logprobs(
    tokenizer: Any, entries: list[list[tuple[int, float, int]] | None]
) -> list[dict[int, p.Logprob] | None]:
    """vLLM's prompt_logprobs: null for the first position, then token id -> logprob and rank."""
    return [
        None
        if entry is None
        else {
            t: p.Logprob(
                logprob=clamp_logprob(lp), rank=rank, decoded_token=token_text(tokenizer, t)
            )
            for t, lp, rank in entry
        }
        for entry in entries
    ]


class CompletionHandler:
    def __init__(self, core: EngineCore, models: ModelsHandler, metrics: EngineMetrics):
        self.core = core
        self.models = models
        self.metrics = metrics

    async def create_completion(self, body: p.CompletionRequest) -> Response:
        core = self.core
        tokenizer: Any = core.tokenizer
        adapter = self.models.resolve(body.model)
        # read now: a trainer may unload the adapter before the answer is written
        adapter_version = None if adapter is None else core.version_of(adapter)
        if isinstance(body.prompt, str):
            prompt_ids = [int(i) for i in tokenizer(body.prompt)["input_ids"]]
        else:
            prompt_ids = list(body.prompt)
            vocab = core.model.get_output_embeddings().weight.shape[0]
            bad = [t for t in prompt_ids if t >= vocab]
            if bad:
                raise OpenAIError(
                    400,
                    f"prompt token ids out of vocabulary (size {vocab}): {bad[:5]}",
                    param="prompt",
                )
        max_tokens = self.models.check_length(
            len(prompt_ids), 16 if body.max_tokens is None else body.max_tokens
        )
        params = generation_params(
            body,
            prompt_ids,
            max_tokens,
            adapter,
            top_logprobs=body.logprobs or 0,
            prompt_logprobs=body.prompt_logprobs,
        )
        if body.stream:
            raise OpenAIError(
                400, "streaming is not supported on /v1/completions by this engine", param="stream"
            )
        generations = start_choices(core, self.metrics, params, body.n)
        finishes = await run_all(generations)
        self.metrics.tokens.inc(sum(len(g.tokens) for g in generations))
        # with n > 1 the response's weight fields are those of choice 0
        version, per_token = generations[0].weight_fields(
            adapter_version if adapter_version is not None else core.version
        )
        prompt_text = body.prompt if isinstance(body.prompt, str) else tokenizer.decode(prompt_ids)
        echo = prompt_text if body.echo else ""
        response = p.CompletionResponse(
            model=body.model or self.models.served_model_name,
            choices=[
                p.CompletionResponseChoice(
                    index=i,
                    text=echo + finish.text,
                    logprobs=None
                    if body.logprobs is None
                    else completion_logprobs(tokenizer, generation, len(echo)),
                    finish_reason=finish.reason,  # type: ignore[arg-type]
                    stop_reason=finish.stop_reason,
                    prompt_logprobs=None
                    if finish.prompt_logprobs is None
                    else prompt_logprobs(tokenizer, finish.prompt_logprobs),
                    prompt_token_ids=prompt_ids if body.return_token_ids else None,
                    token_ids=generation.token_ids if body.return_token_ids else None,
                )
                for i, (generation, finish) in enumerate(zip(generations, finishes, strict=True))
            ],
            usage=usage_of(generations, len(prompt_ids)),
            weight_version=version,
            token_weight_versions=per_token,
        )
        self.metrics.requests.labels("completions", "200").inc()
        return JSONResponse(
            response.model_dump(mode="json"), headers={VERSION_HEADER: str(version)}
        )
