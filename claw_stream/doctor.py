"""`claw-stream doctor`: a running stack checked the way an agent will use it, in words.

Each check says what it found and, when something is wrong, what to do. A prompt refused as
longer than the served context is the failure a new user meets first (the agent gets no
answer at all): the gateway counts such refusals by agent (`claw_gateway_context_refused`,
with the largest prompt refused), and the doctor names the agent and the context that would
hold its prompt.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Literal

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

Outcome = Literal["ok", "warn", "fail"]
ANSWER_ROOM = 1024  # tokens left for an answer beside the agent's prompt


@dataclass(frozen=True)
class Check:
    name: str
    outcome: Outcome
    detail: str


def context_to_hold(prompt_tokens: int) -> int:
    """The context a model needs for a prompt and an answer, rounded up to a power of two as
    model cards give it (8k, 16k, 32k, ...)."""
    context = 1024
    while context < prompt_tokens + ANSWER_ROOM:
        context *= 2
    return context


def _get(client: httpx.Client, url: str) -> httpx.Response | str:
    try:
        return client.get(url)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def check_gateway(client: httpx.Client, root: str) -> tuple[list[Check], str | None, int | None]:
    """The gateway, its engines and its model; the served model's name and context."""
    health = _get(client, f"{root}/healthz")
    if isinstance(health, str):
        hint = "is `claw-stream up` running? (or give --base-url)"
        return [Check("gateway", "fail", f"no answer at {root}: {health}; {hint}")], None, None
    body = health.json()
    problems = "; ".join(body.get("problems") or ())
    checks = [
        Check(
            "gateway",
            "warn" if problems else "ok",
            f"{root}: {problems}" if problems else f"{root} answers",
        )
    ]
    healthy = [b["url"] for b in body.get("backends") or () if b.get("healthy")]
    if not healthy:
        checks.append(Check("engines", "fail", "no inference engine answers the gateway"))
        return checks, None, None
    checks.append(Check("engines", "ok", f"{len(healthy)} healthy: {', '.join(healthy)}"))
    models = _get(client, f"{root}/v1/models")
    if isinstance(models, str) or models.status_code != 200:
        why = models if isinstance(models, str) else f"{models.status_code} {models.text[:200]}"
        checks.append(Check("model", "fail", f"GET /v1/models: {why}"))
        return checks, None, None
    card = (models.json().get("data") or [{}])[0]
    name, context = card.get("id"), card.get("max_model_len")
    checks.append(Check("model", "ok", f"{name}, context {context or 'unknown'} tokens"))
    return checks, name, context if isinstance(context, int) else None


def check_stream(client: httpx.Client, root: str, key: str, model: str) -> Check:
    """A streamed chat call as agents make them; recorded, never trained (X-Claw-Train)."""
    headers = {
        "authorization": f"Bearer {key}",
        "x-session-id": f"doctor-{uuid.uuid4().hex[:12]}",
        "x-turn-type": "side",
        "x-claw-train": "false",
    }
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say OK."}],
        "max_tokens": 8,
        "stream": True,
    }
    started = time.perf_counter()
    first: float | None = None
    finish = None
    try:
        with client.stream(
            "POST", f"{root}/v1/chat/completions", json=body, headers=headers
        ) as answer:
            if answer.status_code != 200:
                answer.read()
                return Check("streamed call", "fail", f"{answer.status_code}: {answer.text[:300]}")
            for line in answer.iter_lines():
                if not line.startswith("data: "):
                    continue
                if first is None:
                    first = time.perf_counter() - started
                if line == "data: [DONE]":
                    break
                for choice in orjson.loads(line[6:]).get("choices") or ():
                    finish = choice.get("finish_reason") or finish
    except (httpx.HTTPError, orjson.JSONDecodeError) as exc:
        return Check("streamed call", "fail", f"{type(exc).__name__}: {exc}")
    if finish is None:
        return Check("streamed call", "fail", "the stream ended without a finish reason")
    took = time.perf_counter() - started
    return Check(
        "streamed call",
        "ok",
        f"first chunk after {first or took:.2f} s, done in {took:.2f} s ({finish})",
    )


def check_refused(client: httpx.Client, root: str, model: str | None, context: int | None) -> Check:
    """Agents whose prompts the served model could not hold, and what would hold them."""
    metrics = _get(client, f"{root}/metrics")
    if isinstance(metrics, str):
        return Check("agents' prompts", "warn", f"cannot read {root}/metrics: {metrics}")
    refused: dict[str, float] = {}
    largest: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics.text):
        for sample in family.samples:
            agent = sample.labels.get("agent", "other")
            if sample.name == "claw_gateway_context_refused_total":
                refused[agent] = refused.get(agent, 0) + sample.value
            elif sample.name == "claw_gateway_refused_prompt_tokens":
                largest[agent] = max(largest.get(agent, 0), sample.value)
    refused = {a: n for a, n in refused.items() if n}
    if not refused:
        return Check("agents' prompts", "ok", "no call refused for its length")
    served = f"{model}'s {context} tokens" if context else "the served context"
    parts = []
    for agent, n in sorted(refused.items()):
        tokens = int(largest.get(agent, 0))
        parts.append(
            f"{agent}: {int(n)} call(s) refused, prompts up to {tokens:,} tokens do not fit "
            f"{served}; a model of at least {context_to_hold(tokens):,} tokens of context "
            "holds them (`claw-stream up --model PATH`)"
        )
    return Check("agents' prompts", "fail", "; ".join(parts))


def check_service(client: httpx.Client, name: str, url: str | None, does: str) -> Check:
    """A service by its metrics endpoint: it answers, or nothing `does` happens."""
    if url is None:
        return Check(name, "warn", "its metrics port is off: cannot tell")
    answer = _get(client, url)
    if isinstance(answer, str) or answer.status_code != 200:
        why = answer if isinstance(answer, str) else f"status {answer.status_code}"
        return Check(
            name, "fail", f"no answer at {url} ({why}): {does} (is `claw-stream {name}` running?)"
        )
    return Check(name, "ok", f"answers at {url}")
