"""The held-out replay: the newest held-out turns (never trained) asked again of the version
served now, as side calls (archived, never trained, not the user's traffic), each new answer
scored against the one the user got, by a rule where one scores the turns, else by the judge;
the results in `replay_results`."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
from openai import OpenAIError

from claw_stream.api.replay_rule import ReplayRule
from claw_stream.evaluation.config import EvalSettings
from claw_stream.evaluation.replay import records
from claw_stream.evaluation.replay.judge import PairJudge
from claw_stream.evaluation.replay.pairs import (
    HeldOutTurn,
    PairScore,
    message_text,
    rule_pair,
)
from claw_stream.names import VERSION_HEADER, policy_model
from claw_stream.plugins import load_replay_rule
from claw_stream.settings import Settings

# what a replay can fail on: the gateway or an engine (httpx), the judge (the SDK's errors)
ReplayError = (httpx.HTTPError, OpenAIError)


@dataclass(frozen=True)
class NamedRule:
    """A rule that scores one answer to a request (higher is better): the persona's, a user's."""

    name: str
    score: ReplayRule


def configured_rule(config: EvalSettings) -> NamedRule | None:
    """`eval.replay_rule` (module:function or an entry point of claw_stream.rewards)."""
    if config.replay_rule is None:
        return None
    fn = load_replay_rule(config.replay_rule, "eval.replay_rule")
    return NamedRule(config.replay_rule, fn)


@dataclass(frozen=True)
class ReplayedAnswer:
    turn: HeldOutTurn
    version: int
    text: str


async def ask_again(
    base_url: str,
    admin_key: str,
    turns: list[HeldOutTurn],
    config: EvalSettings,
    *,
    direct: bool = False,
    tenant: str | None = None,
    model: str | None = None,
) -> list[ReplayedAnswer]:
    """Each turn's request asked again, all at once (the engine batches them, so one version
    answers them all), greedy by default: two versions differ by their weights only. Through
    the gateway as side calls of one session of its own; `direct`: an engine (a candidate).
    With `tenant`, the session is the tenant's (started untrained): the tenant's newest
    adapter answers, as it serves the tenant's own calls. `model`: the model asked (an
    adapter's name), rather than the served one."""
    session = f"replay-{uuid.uuid4().hex[:8]}"
    path = "/v1/chat/completions" if direct else f"/{session}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {admin_key}", "X-Turn-Type": "side"}
    async with httpx.AsyncClient(base_url=base_url, timeout=600, headers=headers) as http:
        if tenant is not None and not direct:
            started = await http.post("/rl/start_session", json={"tenant": tenant, "train": False})
            http.headers["Authorization"] = f"Bearer {started.raise_for_status().json()['api_key']}"
            path = "/v1/chat/completions"  # the key names its session
        model = model or policy_model(
            (await http.get("/v1/models")).raise_for_status().json()["data"]
        )

        async def one(turn: HeldOutTurn) -> ReplayedAnswer | None:
            body: dict[str, Any] = {
                "model": model,
                "messages": turn.request["messages"],
                "max_tokens": config.max_tokens,
                "temperature": config.temperature,
                "seed": 0,
            }
            if turn.request.get("tools"):
                body["tools"] = turn.request["tools"]
            r = await http.post(path, json=body)
            if r.status_code >= 400:  # a request the engine refuses now (too long): skipped
                return None
            message = r.json()["choices"][0]["message"]
            return ReplayedAnswer(
                turn, int(r.headers.get(VERSION_HEADER, 0)), message_text(message)
            )

        answers = await asyncio.gather(*(one(t) for t in turns))
    return [a for a in answers if a is not None]


async def score_answers(
    answers: list[ReplayedAnswer], rule: NamedRule | None, judge: PairJudge | None
) -> list[PairScore]:
    """Each answer against the one the user got: the rule's verdict where there is a rule (and
    the judge's beside it, to measure their agreement), else the judge's."""

    async def one(a: ReplayedAnswer) -> PairScore | None:
        rule_score = judge_score = None
        votes = 0
        if rule is not None:
            rule_score = rule_pair(
                rule.score(a.turn.request, a.text), rule.score(a.turn.request, a.turn.answer)
            )
        if judge is not None:
            judge_score, votes = await judge.score(a.turn, a.text)
        if rule_score is not None:
            score, scorer = rule_score, f"rule:{rule.name}"  # type: ignore[union-attr]
        elif judge_score is not None and judge is not None:
            score, scorer = judge_score, f"judge:{judge.name}"
        else:
            return None  # no vote parsed and no rule: nothing to record
        return PairScore(
            a.turn,
            a.version,
            a.text,
            score,
            scorer,
            rule_score,
            judge_score,
            judge.name if judge is not None else None,
            votes,
        )

    scored = await asyncio.gather(*(one(a) for a in answers))
    return [s for s in scored if s is not None]


@dataclass(frozen=True)
class ReplayRun:
    held_out: int  # held-out turns asked again
    answered: int  # of those, answered (a request the engine refuses now is skipped)
    scores: list[PairScore]  # of those, scored (a judge whose votes never parse scores none)


async def replay(
    settings: Settings,
    config: EvalSettings,
    base_url: str,
    *,
    rule: NamedRule | None = None,
    direct: bool = False,
    tenant: str | None = None,
    model: str | None = None,
) -> ReplayRun:
    """One replay of the held-out turns on the version serving at base_url; saved, returned.
    With `tenant`: the tenant's turns, asked again of its adapter, saved under its name (as
    its versions are); without, the turns of everyone the shared policy serves."""
    rule = rule or configured_rule(config)
    turns = await records.held_out_turns(
        settings.database_url, config.replay_limit, tenant, settings.tenants.adapters
    )
    if not turns:
        return ReplayRun(0, 0, [])
    answers = await ask_again(
        base_url,
        settings.resolved_admin_key(),
        turns,
        config,
        direct=direct,
        tenant=tenant,
        model=model,
    )
    # the judge is asked beside a rule too: their agreement says whether it can be trusted
    async with PairJudge(
        config.judge_url or settings.worker.judge_url,
        config.judge_model or settings.worker.judge_model,
        config.replay_votes,
    ) as judge:
        scores = await score_answers(answers, rule, judge)
    await records.save(settings.database_url, tenant or settings.policy_name, scores)
    return ReplayRun(len(turns), len(answers), scores)
