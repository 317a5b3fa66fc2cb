"""`claw-stream doctor`: a running stack checked the way an agent will use it, in words.

Each check says what it found and, when something is wrong, what to do. A prompt refused as
longer than the served context is the failure a new user meets first (the agent gets no
answer at all): the gateway counts such refusals by agent (`claw_gateway_context_refused`,
with the largest prompt refused), and the doctor names the agent and the context that would
hold its prompt.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from claw_stream.agents.prompts import AGENT_PROMPTS, ANSWER_ROOM, context_to_hold

Outcome = Literal["ok", "warn", "fail"]
DOCTOR_GROUP = "claw-doctor"  # the group of the doctor's own calls, left out of its report
# OpenClaw's first request bodies, recorded (its 12 tools; its full and small-model prompts)
AGENT_REQUESTS = Path(__file__).parents[1] / "data" / "openclaw-first-requests.json"


@dataclass(frozen=True)
class Check:
    name: str
    outcome: Outcome
    detail: str


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


def _headers(key: str, session: str | None = None, side: bool = True) -> dict[str, str]:
    """The doctor's calls: recorded, never trained (X-Claw-Train), in a group of their own."""
    headers = {
        "authorization": f"Bearer {key}",
        "x-group-id": DOCTOR_GROUP,
        "x-claw-train": "false",
        "x-turn-type": "side" if side else "main",
    }
    if session is not None:
        headers["x-session-id"] = session
    return headers


def agent_requests() -> dict[str, Any]:
    return dict(json.loads(AGENT_REQUESTS.read_text()))


def check_stream(client: httpx.Client, root: str, key: str, model: str) -> Check:
    """A streamed chat call as agents make them."""
    headers = _headers(key, f"doctor-{uuid.uuid4().hex[:12]}")
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


def scrape(client: httpx.Client, name: str, url: str | None, does: str) -> tuple[Check, str | None]:
    """A service by its metrics endpoint: it answers (and its page), or nothing `does`
    happens."""
    if url is None:
        return Check(name, "warn", "its metrics port is off: cannot tell"), None
    answer = _get(client, url)
    if isinstance(answer, str) or answer.status_code != 200:
        why = answer if isinstance(answer, str) else f"status {answer.status_code}"
        return Check(
            name, "fail", f"no answer at {url} ({why}): {does} (is `claw-stream {name}` running?)"
        ), None
    return Check(name, "ok", f"answers at {url}"), answer.text


def _call(
    client: httpx.Client, root: str, headers: dict[str, str], body: dict[str, Any]
) -> httpx.Response | str:
    try:
        return client.post(f"{root}/v1/chat/completions", json=body, headers=headers)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _failed(answer: httpx.Response | str) -> str | None:
    if isinstance(answer, str):
        return answer
    if answer.status_code != 200:
        return f"{answer.status_code}: {answer.text[:300]}"
    return None


def check_tools(client: httpx.Client, root: str, key: str, model: str) -> Check:
    """A call with OpenClaw's real tool list (12 tools, ~10 KB of schemas)."""
    tools = agent_requests()["full"]["tools"]
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "List the files here with the ls tool."}],
        "tools": tools,
        "tool_choice": "auto",
        "max_tokens": 48,
    }
    answer = _call(client, root, _headers(key, f"doctor-{uuid.uuid4().hex[:12]}"), body)
    if (why := _failed(answer)) is not None:
        return Check("tool call", "fail", f"a call with OpenClaw's {len(tools)} tools: {why}")
    assert isinstance(answer, httpx.Response)
    choice = answer.json()["choices"][0]
    calls = [c["function"]["name"] for c in choice["message"].get("tool_calls") or ()]
    said = f"it called {', '.join(calls)}" if calls else f"it answered ({choice['finish_reason']})"
    return Check("tool call", "ok", f"OpenClaw's {len(tools)} tools taken; {said}")


def check_stitched(client: httpx.Client, root: str, key: str, model: str) -> Check:
    """Two calls of one conversation that name no session land in one session (its main
    line), as an agent's turns do."""
    marker = f"claw-stream doctor {uuid.uuid4().hex[:12]}"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": marker},
        {"role": "user", "content": "Say OK."},
    ]
    body = {"model": model, "messages": messages, "max_tokens": 4}
    first = _call(client, root, _headers(key, side=False), body)
    if (why := _failed(first)) is not None:
        return Check("one session", "fail", f"first call: {why}")
    assert isinstance(first, httpx.Response)
    reply = {"role": "assistant", "content": first.json()["choices"][0]["message"]["content"]}
    body["messages"] = [*messages, reply, {"role": "user", "content": "Again."}]
    second = _call(client, root, _headers(key, side=False), body)
    if (why := _failed(second)) is not None:
        return Check("one session", "fail", f"second call: {why}")
    assert isinstance(second, httpx.Response)
    sessions = [a.headers.get("x-claw-session-id") for a in (first, second)]
    if sessions[0] is None or sessions[0] != sessions[1]:
        return Check(
            "one session",
            "fail",
            f"two calls of one conversation went to {sessions[0]} and {sessions[1]}: an agent "
            "that names no session would train on each call as a conversation of its own",
        )
    return Check("one session", "ok", f"two calls of one conversation stitched ({sessions[0]})")


def messages_body(chat: dict[str, Any], model: str) -> dict[str, Any]:
    """A chat completions body of system and user text as Anthropic Messages (for the
    gateway's `count_tokens`, which renders it with the engine's chat template)."""
    system = "".join(str(m["content"]) for m in chat["messages"] if m["role"] == "system")
    messages = [
        {"role": m["role"], "content": m["content"]}
        for m in chat["messages"]
        if m["role"] in ("user", "assistant")
    ]
    tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"].get("description", ""),
            "input_schema": t["function"].get("parameters") or {"type": "object"},
        }
        for t in chat.get("tools") or ()
    ]
    return {"model": model, "system": system, "messages": messages, "tools": tools}


def check_agents_fit(context: int | None) -> Check:
    """Which coding agents' first prompts the served context holds, with an answer's room,
    and what would hold the others."""
    if context is None:
        return Check("coding agents", "warn", "the gateway does not say its context")
    room = min(ANSWER_ROOM, context // 4)
    fit, short, refuse = [], [], []
    for a in AGENT_PROMPTS:
        if context < a.minimum:
            refuse.append(f"{a.agent} starts only on {a.minimum:,} or more")
        elif a.tokens + room <= context:
            fit.append(f"{a.agent} (~{a.tokens / 1000:.1f}k)")
        elif a.small is not None and a.small + room <= context:
            fit.append(f"{a.agent} with its small-model profile (~{a.small / 1000:.1f}k)")
        else:
            short.append(a)
    said = f"on {context:,} tokens of context: " + (f"{', '.join(fit)} fit" if fit else "none fits")
    if short:
        largest = max(a.tokens for a in short)
        said += (
            f"; {', '.join(f'{a.agent} (~{a.tokens / 1000:.1f}k)' for a in short)} do not: a "
            f"model of {context_to_hold(largest):,} tokens of context holds them "
            "(`claw-stream up --model`, or a GPU engine)"
        )
    if refuse:
        said += "; " + "; ".join(refuse)
    return Check("coding agents", "warn" if short or refuse else "ok", said)


def check_agent_prompt(
    client: httpx.Client, root: str, key: str, model: str, context: int | None
) -> Check:
    """OpenClaw's real first prompt, full and small-model profile, counted by the gateway with
    the engine's chat template (`/v1/messages/count_tokens`: nothing is generated, recorded or
    refused) against the served context and an answer's room."""
    found: dict[str, int | str] = {}
    for profile in ("full", "small"):
        body = messages_body(agent_requests()[profile], model)
        try:
            answer = client.post(
                f"{root}/v1/messages/count_tokens", json=body, headers=_headers(key)
            )
        except httpx.HTTPError as exc:
            found[profile] = f"{type(exc).__name__}: {exc}"
            continue
        if answer.status_code == 200:
            found[profile] = int(answer.json()["input_tokens"])
        else:
            found[profile] = f"{answer.status_code}: {answer.text[:200]}"
    counted = {p: n for p, n in found.items() if isinstance(n, int)}
    said = "; ".join(
        f"{p} profile {n:,} tokens" if isinstance(n, int) else f"{p} profile: {n}"
        for p, n in found.items()
    )
    if not counted or context is None:
        return Check("agent's prompt", "warn", f"OpenClaw {said}; cannot tell what fits")
    room = min(ANSWER_ROOM, context // 4)
    fits = [p for p, n in counted.items() if n + room <= context]
    served = f"context {context:,}, {room:,} kept for the answer"
    if "full" in fits:
        return Check("agent's prompt", "ok", f"OpenClaw {said} ({served}): both fit")
    if fits:
        return Check(
            "agent's prompt",
            "ok",
            f"OpenClaw {said} ({served}): only its small-model profile fits "
            "(`claw-stream connect openclaw` writes it)",
        )
    largest = max(counted.values())
    return Check(
        "agent's prompt",
        "fail",
        f"OpenClaw {said} ({served}): neither fits; a model of at least "
        f"{context_to_hold(largest):,} tokens of context holds it",
    )


def _samples(text: str) -> dict[str, float]:
    """A metrics page as {name{labels}: value}, labels sorted."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def worker_judge_url(worker_page: str | None) -> str | None:
    """The judge the running worker asks (its `claw_worker_info`), where it says."""
    for family in text_string_to_metric_families(worker_page or ""):
        for sample in family.samples:
            if sample.name == "claw_worker_info" and sample.labels.get("judge_url"):
                return str(sample.labels["judge_url"])
    return None


def check_judge(worker_page: str | None, judge_url: str, timeout: float) -> Check:
    """The judge answers a request, and how the worker's judging goes (its metrics page):
    turns judged, its latency, timeouts and the turns kept for later."""
    judge_url = worker_judge_url(worker_page) or judge_url
    started = time.perf_counter()
    try:
        # a CPU engine that is generating answers its routes late
        with httpx.Client(timeout=max(timeout, 30.0)) as judge:
            answer = judge.get(f"{judge_url.rstrip('/')}/models")
        answer.raise_for_status()
    except httpx.HTTPError as exc:
        return Check("judge", "fail", f"no answer at {judge_url}: {type(exc).__name__} {exc}")
    took = time.perf_counter() - started
    if worker_page is None:
        return Check("judge", "ok", f"{judge_url} answers ({took:.2f} s)")
    m = _samples(worker_page)
    judged = int(m.get("claw_worker_judge_seconds_count", 0))
    mean = m.get("claw_worker_judge_seconds_sum", 0.0) / judged if judged else 0.0
    timeouts = int(m.get("claw_worker_judge_timeouts_total", 0))
    waiting = int(m.get("claw_worker_judge_waiting", 0))
    gave_up = int(m.get("claw_worker_judge_gave_up_total", 0))
    queue = int(m.get("claw_worker_judge_in_flight", 0))
    detail = (
        f"{judge_url} answers; {judged} turns judged, {mean:.1f} s each on average, "
        f"{queue} requests in flight, {timeouts} timeouts, {waiting} turns kept to be judged "
        f"again, {gave_up} given up"
    )
    return Check("judge", "warn" if waiting or gave_up else "ok", detail)


def check_trainer(client: httpx.Client, trainer_metrics: str | None) -> Check:
    """The trainer answers, and what it has trained."""
    base, page = scrape(client, "trainer", trainer_metrics, "nothing is trained")
    if page is None:
        return base
    m = _samples(page)
    steps = int(m.get("claw_trainer_steps_total", 0))
    samples = int(m.get("claw_trainer_samples_total", 0))
    version = int(m.get("claw_trainer_version", 0))
    return Check(
        "trainer", "ok", f"consuming: {steps} steps on {samples} samples, serving version {version}"
    )


@dataclass(frozen=True)
class Stack:
    """Where the running stack's parts answer: `claw-stream up`'s own record
    (DATA_DIR/run/up.json) where there is one, else the settings."""

    database_url: str
    worker_metrics: str | None
    trainer_metrics: str | None
    judge_url: str  # where the worker's judge is, when the worker cannot say


def running_stack(
    run_file: Path, database_url: str, worker: str | None, trainer: str | None, judge_url: str
) -> Stack:
    try:
        services = json.loads(run_file.read_text())["services"]
    except (OSError, ValueError, KeyError):
        return Stack(database_url, worker, trainer, judge_url)
    postgres = (services.get("postgres") or {}).get("url")
    if isinstance(postgres, str) and postgres.startswith("postgresql://"):
        database_url = "postgresql+asyncpg://" + postgres.removeprefix("postgresql://")
    return Stack(
        database_url,
        # `up --workers N` names them worker-1..worker-N: the first answers for them
        (services.get("worker") or services.get("worker-1") or {}).get("url") or worker,
        (services.get("trainer") or {}).get("url") or trainer,
        # `up`'s worker judges with `up`'s engine
        (services.get("engine") or {}).get("url") or judge_url,
    )
