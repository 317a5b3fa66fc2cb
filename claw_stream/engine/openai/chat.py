"""`/v1/chat/completions`: one answer as JSON, or streamed token by token as server-sent events."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse, Response, StreamingResponse

from claw_stream.dialect import OpenAIError
from claw_stream.engine.chat_format import TOOL_OPEN, held_back, parse_tool_calls
from claw_stream.engine.core import FinishEvent, TokenEvent
from claw_stream.engine.openai import protocol as p
from claw_stream.engine.openai.generation import (
    Generation,
    clamp_logprob,
    generation_params,
    raise_if_failed,
    render_chat,
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


def chat_logprobs(tokenizer: Any, events: list[TokenEvent]) -> p.ChatChoiceLogprobs:
    """OpenAI's chat logprobs of `events`: each token with its bytes and its top alternatives."""
    content = []
    for e in events:
        text = token_text(tokenizer, e.token_id)
        content.append(
            p.ChatLogprob(
                token=text,
                logprob=clamp_logprob(e.logprob),
                bytes=list(text.encode("utf-8", errors="replace")),
                top_logprobs=[
                    p.TopLogprob(
                        token=token_text(tokenizer, t),
                        logprob=clamp_logprob(lp),
                        bytes=list(token_text(tokenizer, t).encode("utf-8", errors="replace")),
                    )
                    for t, lp in e.top
                ],
            )
        )
    return p.ChatChoiceLogprobs(content=content)


class ChatHandler:
    def __init__(self, core: EngineCore, models: ModelsHandler, metrics: EngineMetrics):
        self.core = core
        self.models = models
        self.metrics = metrics

    async def create_chat_completion(self, body: p.ChatCompletionRequest) -> Response:
        core, metrics = self.core, self.metrics
        started = time.perf_counter()
        adapter = self.models.resolve(body.model)
        # an adapter's version is its name's, read now: it may be unloaded before the answer
        # is written (a trainer retiring it), and must not fail the answer then
        adapter_version = None if adapter is None else core.version_of(adapter)
        prompt_ids = render_chat(
            core.tokenizer, body.messages, body.tools, body.tool_choice, body.chat_template_kwargs
        )
        params = generation_params(
            body,
            prompt_ids,
            self.models.check_length(len(prompt_ids), body.max_tokens),
            adapter,
            top_logprobs=(body.top_logprobs or 0) if body.logprobs else 0,
        )
        model_name = body.model or self.models.served_model_name
        tools_on = bool(body.tools) and body.tool_choice != "none"
        named_tool = isinstance(body.tool_choice, dict)
        if body.stream and body.n > 1:
            raise OpenAIError(
                400, "n > 1 is not supported with stream: true by this engine", param="n"
            )
        generations = start_choices(core, metrics, params, body.n)
        generation = generations[0]
        metrics.running.inc()
        try:
            if body.stream:
                first = await generation.next()
                if isinstance(first, FinishEvent):
                    raise_if_failed(first)
                stream = self._stream(
                    body, generation, first, model_name, prompt_ids, tools_on, named_tool
                )
                headers = {
                    VERSION_HEADER: str(
                        first.version
                        if isinstance(first, TokenEvent)
                        else (adapter_version if adapter is not None else core.version)
                    )
                }
                return StreamingResponse(
                    _guard(stream, generation, metrics),
                    media_type="text/event-stream",
                    headers=headers,
                )
            finishes = await run_all(generations)
        except BaseException:
            generation.request.cancelled = True
            metrics.running.dec()
            raise
        metrics.running.dec()
        metrics.tokens.inc(sum(len(g.tokens) for g in generations))
        # with n > 1 the response's weight fields are those of choice 0
        version, per_token = generation.weight_fields(
            adapter_version if adapter_version is not None else core.version
        )
        response = p.ChatCompletionResponse(
            model=model_name,
            choices=[
                self._choice(body, i, g, finish, tools_on, named_tool)
                for i, (g, finish) in enumerate(zip(generations, finishes, strict=True))
            ],
            usage=usage_of(generations, len(prompt_ids)),
            prompt_token_ids=prompt_ids if body.return_token_ids else None,
            weight_version=version,
            token_weight_versions=per_token,
        )
        metrics.requests.labels("chat", "200").inc()
        metrics.latency.labels("chat").observe(time.perf_counter() - started)
        return JSONResponse(
            response.model_dump(mode="json"), headers={VERSION_HEADER: str(version)}
        )

    def _choice(
        self,
        body: p.ChatCompletionRequest,
        index: int,
        generation: Generation,
        finish: FinishEvent,
        tools_on: bool,
        named_tool: bool,
    ) -> p.ChatCompletionResponseChoice:
        message = p.ChatCompletionMessage(content=finish.text)
        reason = finish.reason
        if tools_on:
            parsed = parse_tool_calls(finish.text)
            if parsed.tool_calls:
                message = p.ChatCompletionMessage(
                    content=parsed.content,
                    tool_calls=[
                        p.ChatCompletionToolCall(
                            function=p.ChatCompletionFunctionCall(name=n, arguments=a)
                        )
                        for n, a in parsed.tool_calls
                    ],
                )
                reason = "stop" if named_tool else "tool_calls"
        return p.ChatCompletionResponseChoice(
            index=index,
            message=message,
            logprobs=chat_logprobs(self.core.tokenizer, generation.tokens)
            if body.logprobs
            else None,
            finish_reason=reason,  # type: ignore[arg-type]
            stop_reason=finish.stop_reason,
            token_ids=generation.token_ids if body.return_token_ids else None,
        )

    async def _stream(
        self,
        body: p.ChatCompletionRequest,
        generation: Generation,
        first: TokenEvent | FinishEvent,
        model_name: str,
        prompt_ids: list[int],
        tools_on: bool,
        named_tool: bool,
    ) -> AsyncIterator[str]:
        tokenizer = self.core.tokenizer
        created = int(time.time())
        chunk_id = p.random_id("chatcmpl")
        include_usage = body.stream_options is not None and body.stream_options.include_usage

        def chunk(choice: p.ChatCompletionResponseStreamChoice, **extra: Any) -> str:
            out = p.ChatCompletionStreamResponse(
                id=chunk_id, created=created, model=model_name, choices=[choice], **extra
            )
            return f"data: {out.model_dump_json(exclude_none=True)}\n\n"

        yield chunk(
            p.ChatCompletionResponseStreamChoice(
                delta=p.DeltaMessage(role="assistant", content="")
            ),
            prompt_token_ids=prompt_ids if body.return_token_ids else None,
        )
        sent = ""  # content streamed so far
        pending_text = ""  # text not yet streamable (maybe a tool-call marker)
        in_tool = False
        pending: list[TokenEvent] = []
        event: TokenEvent | FinishEvent = first
        while True:
            if isinstance(event, TokenEvent):
                pending.append(event)
                pending_text += event.text
                if tools_on and not in_tool and TOOL_OPEN in sent + pending_text:
                    in_tool = True
                if not in_tool:
                    hold = held_back(pending_text) if tools_on else 0
                    out, pending_text = (
                        pending_text[: len(pending_text) - hold],
                        pending_text[len(pending_text) - hold :],
                    )
                    if out or not tools_on:
                        sent += out
                        yield chunk(
                            p.ChatCompletionResponseStreamChoice(
                                delta=p.DeltaMessage(content=out),
                                logprobs=chat_logprobs(tokenizer, pending)
                                if body.logprobs
                                else None,
                                token_ids=[e.token_id for e in pending]
                                if body.return_token_ids
                                else None,
                            ),
                            weight_version=event.version,
                        )
                        pending = []
                event = await generation.next()
                continue
            finish = event
            break
        self.metrics.tokens.inc(len(generation.tokens))
        version, per_token = generation.weight_fields(self.core.version_of(None))
        delta = p.DeltaMessage()
        reason = finish.reason
        full = finish.text
        if tools_on:
            parsed = parse_tool_calls(full)
            if parsed.tool_calls:
                delta.tool_calls = [
                    p.DeltaToolCall(
                        index=i,
                        id=p.random_id("chatcmpl-tool"),
                        type="function",
                        function=p.DeltaFunctionCall(name=n, arguments=a),
                    )
                    for i, (n, a) in enumerate(parsed.tool_calls)
                ]
                reason = "stop" if named_tool else "tool_calls"
                rest = parsed.content or ""
                delta.content = (
                    rest[len(sent) :] if rest.startswith(sent) and len(rest) > len(sent) else None
                )
            elif full.startswith(sent) and len(full) > len(sent):
                delta.content = full[len(sent) :]
        elif full.startswith(sent) and len(full) > len(sent):
            delta.content = full[len(sent) :]  # detokenisation settled differently at the end
        yield chunk(
            p.ChatCompletionResponseStreamChoice(
                delta=delta,
                finish_reason=reason,  # type: ignore[arg-type]
                stop_reason=finish.stop_reason,
                logprobs=chat_logprobs(tokenizer, pending) if body.logprobs and pending else None,
                token_ids=[e.token_id for e in pending] if body.return_token_ids else None,
            ),
            weight_version=version,
            token_weight_versions=per_token,
        )
        if include_usage:
            usage = p.ChatCompletionStreamResponse(
                id=chunk_id,
                created=created,
                model=model_name,
                choices=[],
                usage=generation.usage(len(prompt_ids)),
            )
            yield f"data: {usage.model_dump_json(exclude_none=True)}\n\n"
        self.metrics.requests.labels("chat_stream", "200").inc()
        yield "data: [DONE]\n\n"


async def _guard(
    stream: AsyncIterator[str], generation: Generation, metrics: EngineMetrics
) -> AsyncIterator[str]:
    """Cancel the generation when the client goes away; keep the gauges right."""
    try:
        async for item in stream:
            yield item
    except Exception as exc:  # an error mid-stream is reported in-band, as vLLM does
        yield f"data: {json.dumps({'error': {'message': str(exc), 'type': 'InternalServerError', 'param': None, 'code': 500}})}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        generation.request.cancelled = True
        metrics.running.dec()
