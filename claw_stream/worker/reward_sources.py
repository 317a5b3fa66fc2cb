"""Reward sources other than the PRM judge: a user's rule over the turn, a discriminative
reward model, an HTTP callback (docs/extending/reward-source.md). Each scores one turn, with
the session's metadata (the ground truth a client passed at `/rl/start_session` or
`/rl/set_reward`), within its own timeout; one that fails or times out is recorded with its
error and the turn is judged without it.

A scorer (the `rule` kind, or any `module:function` / entry point of claw_stream.rewards) is
a `claw_stream.api.Scorer`, `fn(turn, metadata)`, sync or async, returning a number, a `Score`,
a `(score, explanation)` pair, a `{"score", "explanation"}` mapping, or None to abstain. A sync
scorer runs in a thread, so a slow one cannot stall the worker's event loop. Each source here
is a `claw_stream.api.RewardSource`.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp

from claw_stream.api.reward_source import RewardSource, Score, Scorer
from claw_stream.events import SessionEvent, SourceScore, Turn
from claw_stream.plugins import load_scorer
from claw_stream.worker.config import RewardSourceSettings, WorkerSettings

RM_MAX_CHARS = 16_000  # the reward model reads the newest part of a longer conversation


class SourceFailed(RuntimeError):
    """A source that answered something that is not a score."""


def as_score(value: Any, name: str) -> Score | None:
    """A scorer's answer as a Score, None when it abstains (it answered None: no ground truth
    for this session, say); SourceFailed when it is none of the accepted shapes."""
    if value is None:
        return None
    explanation = None
    if isinstance(value, Score):
        value, explanation = value.score, value.explanation
    elif isinstance(value, tuple) and len(value) == 2:
        value, explanation = value
    elif isinstance(value, Mapping):
        value, explanation = value.get("score"), value.get("explanation")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SourceFailed(f"{name} returned {type(value).__name__}, not a number")
    if not math.isfinite(value):
        raise SourceFailed(f"{name} returned {value}")
    return Score(float(value), None if explanation is None else str(explanation))


def session_metadata(events: Iterable[SessionEvent]) -> dict[str, Any]:
    """A session's metadata: `started` then `reward` events' metadata, later keys winning."""
    merged: dict[str, Any] = {}
    for event in sorted(events, key=lambda e: (e.created_at, e.event_id)):
        if event.metadata and event.kind in ("started", "reward"):
            merged.update(event.metadata)
    return merged


class RuleSource:
    def __init__(self, config: RewardSourceSettings, scorer: Scorer):
        self.name = config.source_name
        self.timeout_s = config.timeout_s
        self.scorer = scorer

    async def score(self, turn: Turn, metadata: Mapping[str, Any]) -> Score | None:
        if inspect.iscoroutinefunction(self.scorer):
            value = await self.scorer(turn, metadata)
        else:
            value = await asyncio.to_thread(self.scorer, turn, metadata)
            if inspect.isawaitable(value):
                value = await value
        return as_score(value, self.name)

    async def aclose(self) -> None:
        return None


class _HttpSource:
    """A source that posts JSON; its aiohttp session is made in the running loop, on first use."""

    def __init__(self, config: RewardSourceSettings):
        self.config = config
        self.name = config.source_name
        self.timeout_s = config.timeout_s
        self._http: aiohttp.ClientSession | None = None

    async def post(self, url: str, body: dict[str, Any]) -> Any:
        if self._http is None:
            key = self.config.api_key
            self._http = aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {key}"} if key else {},
                raise_for_status=True,
            )
        async with self._http.post(url, json=body) as response:
            return await response.json(content_type=None)

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()


class ExternalSource(_HttpSource):
    """POST {"source", "turn", "metadata"} to the user's URL; it answers {"score",
    "explanation"?}."""

    async def score(self, turn: Turn, metadata: Mapping[str, Any]) -> Score | None:
        assert self.config.url is not None
        body = {"source": self.name, "turn": turn.model_dump(mode="json"), "metadata": metadata}
        return as_score(await self.post(self.config.url, body), self.name)


def rm_text(turn: Turn, max_chars: int = RM_MAX_CHARS) -> str:
    """What a reward model reads: the conversation up to the answer, then the answer (its
    newest `max_chars`: the answer and what it replied to matter most)."""
    lines = [
        f"{m.role}: {m.content or ''}"
        for m in turn.step.request.messages
        if m.role not in ("system", "developer")
    ]
    lines.append(f"assistant: {turn.step.response.message.content or ''}")
    return "\n".join(lines)[-max_chars:]


class RewardModelSource(_HttpSource):
    """A sequence-classification reward model behind vLLM's `POST /classify` (the built-in
    engine serves the same route): the score is 2p - 1, p the probability of the positive
    class, so it lies in [-1, 1] like the PRM's."""

    async def score(self, turn: Turn, metadata: Mapping[str, Any]) -> Score:
        assert self.config.url is not None
        root = self.config.url.rstrip("/").removesuffix("/v1")
        body: dict[str, Any] = {"input": [rm_text(turn)]}
        if self.config.model:
            body["model"] = self.config.model
        answer = await self.post(f"{root}/classify", body)
        try:
            entry = answer["data"][0]
            probs = [float(p) for p in entry["probs"]]
            p = probs[self.config.positive_label]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise SourceFailed(f"{self.name}: not a /classify answer: {exc!r}") from None
        return Score(2.0 * p - 1.0, f"label {entry.get('label')!s}, p={p:.4f}")


def load_sources(config: WorkerSettings) -> list[RewardSource]:
    """The configured sources other than prm, their scorers imported now: a bad path or a
    module that raises at import fails here (PluginError names the source)."""
    sources: list[RewardSource] = []
    for c in config.plugin_sources:
        if c.kind == "external":
            sources.append(ExternalSource(c))
        elif c.kind == "rm":
            sources.append(RewardModelSource(c))
        else:
            assert c.scorer is not None
            where = f"worker.rewards[{c.source_name}] ({c.scorer})"
            sources.append(RuleSource(c, load_scorer(c.scorer, where)))
    return sources


async def _one(source: RewardSource, turn: Turn, metadata: Mapping[str, Any]) -> SourceScore:
    try:
        result = await asyncio.wait_for(source.score(turn, metadata), source.timeout_s)
    except TimeoutError:
        error = f"no score within {source.timeout_s:g} s"
    except Exception as exc:  # a user's code may raise anything: recorded, never fatal
        error = f"{type(exc).__name__}: {exc}"
    else:
        if result is None:
            return SourceScore(source=source.name)
        return SourceScore(source=source.name, score=result.score, explanation=result.explanation)
    return SourceScore(source=source.name, error=error[:2000])


async def score_all(
    sources: list[RewardSource], turn: Turn, metadata: Mapping[str, Any]
) -> list[SourceScore]:
    """Every source's score of the turn, concurrently; failed ones carry their error."""
    return list(await asyncio.gather(*(_one(s, turn, metadata) for s in sources)))
