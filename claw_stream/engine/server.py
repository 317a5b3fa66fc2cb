"""HTTP front of the built-in engine: vLLM's OpenAI-compatible routes plus live weight loading."""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from safetensors.torch import load_file

from claw_stream.dialect import OpenAIError, install_error_handlers
from claw_stream.engine import protocol as p
from claw_stream.engine.chat_format import TOOL_OPEN, held_back, parse_tool_calls, render_prompt
from claw_stream.engine.core import EngineCore, FinishEvent, GenerationParams, TokenEvent
from claw_stream.engine.core import Request as CoreRequest

VERSION_HEADER = "X-Claw-Weight-Version"
LOGPROB_FLOOR = -9999.0  # vLLM clamps -inf to this


@dataclass
class EngineOptions:
    served_model_name: str
    admin_key: str | None = None
    default_max_tokens: int = 1024


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "claw_engine_requests", "Requests by route and status", ["route", "status"], registry=r
        )
        self.tokens = Counter("claw_engine_generated_tokens", "Tokens generated", registry=r)
        self.prompt_tokens = Counter(
            "claw_engine_prompt_tokens", "Prompt tokens processed", registry=r
        )
        self.latency = Histogram(
            "claw_engine_request_seconds", "Request latency", ["route"], registry=r
        )
        self.running = Gauge("claw_engine_running_requests", "Requests in flight", registry=r)
        self.version = Gauge("claw_engine_weight_version", "Served base weight version", registry=r)
        self.swap = Histogram(
            "claw_engine_weight_swap_seconds", "Time to load and swap weights", registry=r
        )


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


def _clamp(x: float) -> float:
    return max(x, LOGPROB_FLOOR)


class Generation:
    """Collects one request's events: tokens, versions, logprobs, then the finish."""

    def __init__(self, core_request: CoreRequest):
        self.request = core_request
        self.tokens: list[TokenEvent] = []
        self.finish: FinishEvent | None = None

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


def create_app(core: EngineCore, options: EngineOptions) -> FastAPI:
    app = FastAPI(title="claw-stream engine", version="1")
    install_error_handlers(app, validation_status=400)
    metrics = Metrics()
    metrics.version.set(core.version)
    tokenizer = core.tokenizer
    app.state.core = core

    def resolve(model: str | None) -> str | None:
        """The adapter to use; the served name means the newest trained policy version."""
        if model in (None, "", options.served_model_name, str(core.model_path)):
            return core.latest_policy_adapter()
        if model in core.adapters:
            return model
        raise OpenAIError(404, f"The model `{model}` does not exist.", param="model")

    def check_length(n_prompt: int, max_tokens: int | None) -> int:
        limit = core.max_model_len
        if n_prompt >= limit:
            raise OpenAIError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your request has "
                f"{n_prompt} input tokens. Please reduce the length of the input messages.",
                param="messages",
            )
        if max_tokens is None:
            return min(limit - n_prompt, options.default_max_tokens)
        if n_prompt + max_tokens > limit:
            raise OpenAIError(
                400,
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
                f"maximum context length is {limit} tokens and your request has {n_prompt} input "
                f"tokens ({max_tokens} > {limit} - {n_prompt}).",
                param="max_tokens",
            )
        return max_tokens

    def start(params: GenerationParams) -> Generation:
        request = CoreRequest(params, asyncio.get_running_loop())
        core.submit(request)
        metrics.prompt_tokens.inc(len(params.prompt_ids))
        return Generation(request)

    def token_text(token_id: int) -> str:
        return tokenizer.decode([token_id])

    def chat_logprobs(events: list[TokenEvent]) -> p.ChatChoiceLogprobs:
        content = []
        for e in events:
            text = token_text(e.token_id)
            content.append(
                p.ChatLogprob(
                    token=text,
                    logprob=_clamp(e.logprob),
                    bytes=list(text.encode("utf-8", errors="replace")),
                    top_logprobs=[
                        p.TopLogprob(
                            token=token_text(t),
                            logprob=_clamp(lp),
                            bytes=list(token_text(t).encode("utf-8", errors="replace")),
                        )
                        for t, lp in e.top
                    ],
                )
            )
        return p.ChatChoiceLogprobs(content=content)

    def raise_if_failed(finish: FinishEvent) -> None:
        if finish.error is not None and not finish.text:
            raise OpenAIError(
                503 if "unloaded" in finish.error else 500, f"generation failed: {finish.error}"
            )

    # -- routes ------------------------------------------------------------------------------

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.version.set(core.version)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> p.ModelList:
        cards = [
            p.ModelCard(
                id=options.served_model_name,
                root=str(core.model_path),
                max_model_len=core.max_model_len,
                weight_version=core.version,
            )
        ]
        for name, version in core.adapters.items():
            cards.append(
                p.ModelCard(id=name, parent=options.served_model_name, weight_version=version)
            )
        return p.ModelList(data=cards)

    @app.post("/tokenize")
    async def tokenize(body: p.TokenizeRequest) -> p.TokenizeResponse:
        resolve(body.model)
        if body.messages is not None:
            try:
                tokens = render_prompt(
                    tokenizer, body.messages, body.tools, None, body.add_generation_prompt
                )
            except (ValueError, TypeError, KeyError) as exc:
                raise OpenAIError(
                    400, f"cannot render messages with the chat template: {exc}", param="messages"
                ) from None
        else:
            encoded = tokenizer(body.prompt, add_special_tokens=body.add_special_tokens)
            tokens = [int(i) for i in encoded["input_ids"]]
        return p.TokenizeResponse(
            count=len(tokens), max_model_len=core.max_model_len, tokens=tokens
        )

    @app.post("/v1/chat/completions")
    async def chat(body: p.ChatCompletionRequest, raw: Request) -> Response:
        started = time.perf_counter()
        adapter = resolve(body.model)
        try:
            prompt_ids = render_prompt(tokenizer, body.messages, body.tools, body.tool_choice)
        except (ValueError, TypeError, KeyError) as exc:
            raise OpenAIError(
                400, f"cannot render messages with the chat template: {exc}", param="messages"
            ) from None
        params = generation_params(
            body,
            prompt_ids,
            check_length(len(prompt_ids), body.max_tokens),
            adapter,
            top_logprobs=(body.top_logprobs or 0) if body.logprobs else 0,
        )
        model_name = body.model or options.served_model_name
        tools_on = bool(body.tools) and body.tool_choice != "none"
        named_tool = isinstance(body.tool_choice, dict)
        generation = start(params)
        metrics.running.inc()
        try:
            if body.stream:
                first = await generation.next()
                if isinstance(first, FinishEvent):
                    raise_if_failed(first)
                stream = _chat_stream(
                    body, generation, first, model_name, prompt_ids, tools_on, named_tool
                )
                headers = {
                    VERSION_HEADER: str(
                        first.version if isinstance(first, TokenEvent) else core.version_of(adapter)
                    )
                }
                return StreamingResponse(
                    _guard(stream, generation, metrics),
                    media_type="text/event-stream",
                    headers=headers,
                )
            finish = await generation.run()
            raise_if_failed(finish)
        except BaseException:
            generation.request.cancelled = True
            metrics.running.dec()
            raise
        metrics.running.dec()
        metrics.tokens.inc(len(generation.tokens))
        version, per_token = generation.weight_fields(core.version_of(adapter))
        text = finish.text
        message = p.ChatMessage(content=text)
        reason = finish.reason
        if tools_on:
            parsed = parse_tool_calls(text)
            if parsed.tool_calls:
                message = p.ChatMessage(
                    content=parsed.content,
                    tool_calls=[
                        p.ToolCall(function=p.FunctionCall(name=n, arguments=a))
                        for n, a in parsed.tool_calls
                    ],
                )
                reason = "stop" if named_tool else "tool_calls"
        response = p.ChatCompletionResponse(
            model=model_name,
            choices=[
                p.ChatCompletionResponseChoice(
                    message=message,
                    logprobs=chat_logprobs(generation.tokens) if body.logprobs else None,
                    finish_reason=reason,  # type: ignore[arg-type]
                    stop_reason=finish.stop_reason,
                    token_ids=generation.token_ids if body.return_token_ids else None,
                )
            ],
            usage=p.UsageInfo(
                prompt_tokens=len(prompt_ids),
                completion_tokens=len(generation.tokens),
                total_tokens=len(prompt_ids) + len(generation.tokens),
            ),
            prompt_token_ids=prompt_ids if body.return_token_ids else None,
            weight_version=version,
            token_weight_versions=per_token,
        )
        metrics.requests.labels("chat", "200").inc()
        metrics.latency.labels("chat").observe(time.perf_counter() - started)
        return JSONResponse(
            response.model_dump(mode="json"), headers={VERSION_HEADER: str(version)}
        )

    async def _chat_stream(
        body: p.ChatCompletionRequest,
        generation: Generation,
        first: TokenEvent | FinishEvent,
        model_name: str,
        prompt_ids: list[int],
        tools_on: bool,
        named_tool: bool,
    ) -> AsyncIterator[str]:
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
                                logprobs=chat_logprobs(pending) if body.logprobs else None,
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
        metrics.tokens.inc(len(generation.tokens))
        version, per_token = generation.weight_fields(core.version_of(None))
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
                logprobs=chat_logprobs(pending) if body.logprobs and pending else None,
                token_ids=[e.token_id for e in pending] if body.return_token_ids else None,
            ),
            weight_version=version,
            token_weight_versions=per_token,
        )
        if include_usage:
            usage = p.UsageInfo(
                prompt_tokens=len(prompt_ids),
                completion_tokens=len(generation.tokens),
                total_tokens=len(prompt_ids) + len(generation.tokens),
            )
            out = p.ChatCompletionStreamResponse(
                id=chunk_id, created=created, model=model_name, choices=[], usage=usage
            )
            yield f"data: {out.model_dump_json(exclude_none=True)}\n\n"
        metrics.requests.labels("chat_stream", "200").inc()
        yield "data: [DONE]\n\n"

    @app.post("/v1/completions")
    async def completions(body: p.CompletionRequest) -> Response:
        adapter = resolve(body.model)
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
        max_tokens = check_length(
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
        generation = start(params)
        try:
            finish = await generation.run()
        except BaseException:
            generation.request.cancelled = True
            raise
        raise_if_failed(finish)
        metrics.tokens.inc(len(generation.tokens))
        version, per_token = generation.weight_fields(core.version_of(adapter))
        prompt_text = body.prompt if isinstance(body.prompt, str) else tokenizer.decode(prompt_ids)
        text = (prompt_text if body.echo else "") + finish.text
        logprobs = None
        if body.logprobs is not None:
            logprobs = p.CompletionLogProbs()
            offset = len(prompt_text) if body.echo else 0
            for e in generation.tokens:
                token = token_text(e.token_id)
                logprobs.text_offset.append(offset)
                logprobs.tokens.append(token)
                logprobs.token_logprobs.append(_clamp(e.logprob))
                tops = {token_text(t): _clamp(lp) for t, lp in e.top}
                tops.setdefault(token, _clamp(e.logprob))
                logprobs.top_logprobs.append(tops)
                offset += len(token)
        prompt_logprobs = None
        if finish.prompt_logprobs is not None:
            prompt_logprobs = [
                None
                if entry is None
                else {
                    t: p.Logprob(logprob=_clamp(lp), rank=rank, decoded_token=token_text(t))
                    for t, lp, rank in entry
                }
                for entry in finish.prompt_logprobs
            ]
        response = p.CompletionResponse(
            model=body.model or options.served_model_name,
            choices=[
                p.CompletionResponseChoice(
                    text=text,
                    logprobs=logprobs,
                    finish_reason=finish.reason,  # type: ignore[arg-type]
                    stop_reason=finish.stop_reason,
                    prompt_logprobs=prompt_logprobs,
                    prompt_token_ids=prompt_ids if body.return_token_ids else None,
                    token_ids=generation.token_ids if body.return_token_ids else None,
                )
            ],
            usage=p.UsageInfo(
                prompt_tokens=len(prompt_ids),
                completion_tokens=len(generation.tokens),
                total_tokens=len(prompt_ids) + len(generation.tokens),
            ),
            weight_version=version,
            token_weight_versions=per_token,
        )
        metrics.requests.labels("completions", "200").inc()
        return JSONResponse(
            response.model_dump(mode="json"), headers={VERSION_HEADER: str(version)}
        )

    # -- live weights ---------------------------------------------------------------------------

    def require_admin(request: Request) -> None:
        if options.admin_key is None:
            return
        header = request.headers.get("authorization", "")
        token = header.removeprefix("Bearer ").strip()
        if not hmac.compare_digest(token.encode(), options.admin_key.encode()):
            raise OpenAIError(401, "admin key required (Authorization: Bearer <admin key>)")

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: p.LoadLoRAAdapterRequest) -> Response:
        if body.lora_name in core.adapters:
            raise OpenAIError(
                400,
                f"The lora adapter '{body.lora_name}' has already been loaded.",
                param="lora_name",
            )
        if not (Path(body.lora_path) / "adapter_config.json").is_file():
            raise OpenAIError(404, f"No adapter found at {body.lora_path}", param="lora_path")
        try:
            await asyncio.wrap_future(
                core.call(lambda: core.load_adapter(body.lora_name, body.lora_path))
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise OpenAIError(400, f"cannot load adapter {body.lora_name}: {exc}") from None
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: p.UnloadLoRAAdapterRequest) -> Response:
        if body.lora_name not in core.adapters:
            raise OpenAIError(
                404, f"The lora adapter '{body.lora_name}' cannot be found.", param="lora_name"
            )
        await asyncio.wrap_future(core.call(lambda: core.unload_adapter(body.lora_name)))
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    @app.post("/admin/load_weights")
    async def load_weights(body: p.LoadWeightsRequest, request: Request) -> Response:
        require_admin(request)
        started = time.perf_counter()
        folder = Path(body.path)
        files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
        if not files:
            raise OpenAIError(404, f"no safetensors files in {folder}", param="path")
        state: dict[str, Any] = {}
        for file in files:
            state.update(await asyncio.to_thread(load_file, str(file)))

        def swap() -> int:
            version = core.version + 1 if body.version is None else body.version
            core.load_weights(state, version)
            return version

        try:
            version = await asyncio.wrap_future(core.call(swap))
        except ValueError as exc:
            status = 409 if "not newer" in str(exc) else 400
            raise OpenAIError(
                status, str(exc), param="version" if status == 409 else "path"
            ) from None
        seconds = time.perf_counter() - started
        metrics.swap.observe(seconds)
        metrics.version.set(version)
        return JSONResponse(
            {"weight_version": version, "seconds": round(seconds, 4)},
            headers={VERSION_HEADER: str(version)},
        )

    return app


async def _guard(
    stream: AsyncIterator[str], generation: Generation, metrics: Metrics
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
