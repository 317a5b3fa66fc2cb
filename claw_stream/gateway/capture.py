"""From a client's request and the engine's answer to a `Step`, with exactly the sampled tokens.

The gateway asks the engine for `return_token_ids` and `logprobs` whatever the client asked;
`strip_*` removes what the client did not ask for before it sees the answer. Tokens are never
re-derived from text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from claw_stream.engine.chat_format import flatten_content
from claw_stream.events import (
    ChatMessage,
    FunctionCall,
    SamplingParams,
    Step,
    StepRequest,
    StepResponse,
    ToolCall,
    Usage,
)

_KNOWN = {
    "model",
    "messages",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "n",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "return_token_ids",
}
_VERSION_SUFFIX = re.compile(r"@v(\d+)$")


@dataclass
class ClientAsked:
    """What the client asked for itself; the rest is stripped from what it receives."""

    token_ids: bool
    logprobs: bool
    usage: bool


def prepare_upstream(body: dict[str, Any]) -> tuple[dict[str, Any], ClientAsked]:
    """The body sent to the engine: the client's, plus token ids, logprobs and stream usage."""
    asked = ClientAsked(
        token_ids=bool(body.get("return_token_ids")),
        logprobs=bool(body.get("logprobs")),
        usage=bool((body.get("stream_options") or {}).get("include_usage")),
    )
    upstream = dict(body)
    upstream["return_token_ids"] = True
    upstream["logprobs"] = True
    if body.get("stream"):
        upstream["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return upstream, asked


def strip_response(payload: dict[str, Any], asked: ClientAsked) -> None:
    """Remove from a response (or a stream chunk) the capture fields the client did not ask for."""
    if not asked.token_ids:
        payload.pop("prompt_token_ids", None)
    for choice in payload.get("choices") or ():
        if not asked.token_ids:
            choice.pop("token_ids", None)
            choice.pop("prompt_token_ids", None)
        if not asked.logprobs and "logprobs" in choice:
            choice["logprobs"] = None


def _message(raw: dict[str, Any]) -> ChatMessage:
    calls = None
    if raw.get("tool_calls"):
        calls = [
            ToolCall(
                id=str(c.get("id") or f"call_{i}"),
                function=FunctionCall(
                    name=str((c.get("function") or {}).get("name", "")),
                    arguments=_arguments((c.get("function") or {}).get("arguments")),
                ),
            )
            for i, c in enumerate(raw["tool_calls"])
        ]
    role = raw.get("role")
    return ChatMessage(
        role=role,  # type: ignore[arg-type]  # the model validates it
        content=None if raw.get("content") is None else flatten_content(raw.get("content")),
        name=raw.get("name"),
        tool_calls=calls,
        tool_call_id=raw.get("tool_call_id"),
        reasoning_content=raw.get("reasoning_content"),
    )


def _arguments(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value if value is not None else {})


def step_request(body: dict[str, Any]) -> StepRequest:
    stop = body.get("stop")
    sampling = SamplingParams(
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        max_tokens=body.get("max_completion_tokens") or body.get("max_tokens"),
        stop=[stop] if isinstance(stop, str) else stop,
        seed=body.get("seed"),
        n=body.get("n") or 1,
    )
    return StepRequest(
        model=str(body.get("model")),
        messages=[_message(m) for m in body["messages"]],
        tools=body.get("tools"),
        tool_choice=body.get("tool_choice"),
        sampling=sampling,
        stream=bool(body.get("stream")),
        extra={k: v for k, v in body.items() if k not in _KNOWN},
    )


def weight_version(payload: dict[str, Any], header: str | None, model: str | None) -> int:
    if isinstance(payload.get("weight_version"), int):
        return payload["weight_version"]
    if header and header.isdigit():
        return int(header)
    match = _VERSION_SUFFIX.search(model or "")
    return int(match.group(1)) if match else 0


@dataclass
class StepContext:
    step_id: uuid.UUID
    session_id: str
    group_id: str | None
    turn_type: str
    turn_index: int
    body: dict[str, Any]  # the client's body, session fields removed
    engine: str = ""


@dataclass
class StreamAccumulator:
    """Assembles the answer of a streamed call from its chunks, as they pass through."""

    prompt_token_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    weight_version: int | None = None
    model: str | None = None

    def add(self, chunk: dict[str, Any]) -> None:
        if chunk.get("prompt_token_ids"):
            self.prompt_token_ids = list(chunk["prompt_token_ids"])
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if isinstance(chunk.get("weight_version"), int) and self.weight_version is None:
            self.weight_version = chunk["weight_version"]
        self.model = self.model or chunk.get("model")
        for choice in chunk.get("choices") or ():
            if choice.get("prompt_token_ids"):
                self.prompt_token_ids = list(choice["prompt_token_ids"])
            self.token_ids.extend(choice.get("token_ids") or ())
            for entry in (choice.get("logprobs") or {}).get("content") or ():
                self.logprobs.append(float(entry["logprob"]))
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content.append(delta["content"])
            if delta.get("reasoning_content"):
                self.reasoning.append(delta["reasoning_content"])
            for call in delta.get("tool_calls") or ():
                slot = self.tool_calls.setdefault(
                    call.get("index", 0), {"id": None, "name": "", "arguments": ""}
                )
                slot["id"] = call.get("id") or slot["id"]
                fn = call.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def as_response(self) -> dict[str, Any]:
        """The same shape as a non-streamed response, for `build_step`."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for _, c in sorted(self.tool_calls.items())
            ]
        return {
            "model": self.model,
            "prompt_token_ids": self.prompt_token_ids,
            "choices": [
                {
                    "message": message,
                    "finish_reason": self.finish_reason,
                    "token_ids": self.token_ids,
                    "logprobs": {"content": [{"logprob": lp} for lp in self.logprobs]},
                }
            ],
            "usage": self.usage,
            "weight_version": self.weight_version,
        }


def build_step(ctx: StepContext, response: dict[str, Any], version: int, latency_ms: float) -> Step:
    choice = (response.get("choices") or [{}])[0]
    token_ids = list(choice.get("token_ids") or ())
    logprobs = [float(e["logprob"]) for e in ((choice.get("logprobs") or {}).get("content") or ())]
    prompt_ids = list(response.get("prompt_token_ids") or choice.get("prompt_token_ids") or ())
    usage = response.get("usage") or {}
    message = dict(choice.get("message") or {})
    message["role"] = "assistant"
    return Step(
        step_id=ctx.step_id,
        session_id=ctx.session_id,
        group_id=ctx.group_id,
        turn_type=ctx.turn_type,  # type: ignore[arg-type]
        turn_index=ctx.turn_index,
        request=step_request(ctx.body),
        response=StepResponse(message=_message(message), finish_reason=choice.get("finish_reason")),
        prompt_token_ids=prompt_ids,
        response_token_ids=token_ids,
        response_logprobs=[min(lp, 0.0) for lp in logprobs],
        weight_version=version,
        engine=ctx.engine,
        latency_ms=latency_ms,
        usage=Usage(
            prompt_tokens=int(usage.get("prompt_tokens", len(prompt_ids))),
            completion_tokens=int(usage.get("completion_tokens", len(token_ids))),
            total_tokens=int(usage.get("total_tokens", len(prompt_ids) + len(token_ids))),
        ),
    )
