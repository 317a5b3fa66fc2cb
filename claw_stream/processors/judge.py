"""The judge: PRM votes and OPD hints from an OpenAI-compatible server, teacher log-probs.

Votes run in parallel under one concurrency cap per worker; each request has a timeout and
is retried (tenacity) on connection errors, timeouts and 5xx/429. A vote that still fails is
reported as an error and counts as no vote. The client is aiohttp: httpx cost about a quarter
of a worker's CPU in the pipeline benchmark (as it did on the gateway's hot path).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from claw_stream.events import HintVote, Judgement, Turn
from claw_stream.ids import derive_uuid7
from claw_stream.names import Vote
from claw_stream.processors.config import PipelineConfig
from claw_stream.processors.judging import (
    choose_hint,
    majority,
    opd_messages,
    parse_hint,
    parse_vote,
    prm_messages,
    teacher_messages,
)

log = logging.getLogger(__name__)
REQUEST_ERRORS = (aiohttp.ClientError, TimeoutError, KeyError, IndexError, ValueError)


def judgement_id_of(turn: Turn) -> uuid.UUID:
    return derive_uuid7(turn.turn_id, "judgement")


class JudgeError(RuntimeError):
    """A judge request that failed after its retries."""


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, aiohttp.ClientResponseError):
        return exc.status >= 500 or exc.status == 429
    return isinstance(exc, aiohttp.ClientConnectionError | TimeoutError)


@dataclass
class JudgeOutcome:
    judgement: Judgement
    errors: list[str] = field(default_factory=list)  # requests that failed after retries


class JudgeClient:
    def __init__(self, config: PipelineConfig):
        """Create it inside the running event loop (aiohttp binds its session to it)."""
        self.config = config
        base = config.judge_url.rstrip("/")
        self.base = base
        self.root = base.removesuffix("/v1")
        headers = (
            {"Authorization": f"Bearer {config.judge_api_key}"} if config.judge_api_key else {}
        )
        self.http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=config.judge_timeout_s, connect=10.0),
            headers=headers,
            raise_for_status=True,
        )
        self.slots = asyncio.Semaphore(config.judge_concurrency)
        self._model: str | None = config.judge_model

    async def aclose(self) -> None:
        await self.http.close()

    async def _post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(self.config.judge_retries + 1),
            wait=wait_exponential(multiplier=0.5, max=10) + wait_random(0, 0.5),
            retry=retry_if_exception(_retryable),
            reraise=True,
        ):
            with attempt:
                async with self.slots, self.http.post(url, json=body) as response:
                    return await response.json(content_type=None)
        raise AssertionError("unreachable")

    async def model(self) -> str:
        if self._model is None:
            async with self.http.get(f"{self.base}/models") as response:
                self._model = (await response.json(content_type=None))["data"][0]["id"]
        return self._model

    async def _complete(self, messages: list[dict[str, Any]]) -> str:
        try:
            body = await self._post(
                f"{self.base}/chat/completions",
                {
                    "model": await self.model(),
                    "messages": messages,
                    "temperature": self.config.judge_temperature,
                    "max_tokens": self.config.judge_max_tokens,
                },
            )
            return body["choices"][0]["message"].get("content") or ""
        except REQUEST_ERRORS as exc:
            raise JudgeError(f"{type(exc).__name__}: {exc}") from exc

    async def _votes(self, messages: list[dict[str, Any]], m: int) -> list[str | JudgeError]:
        results = await asyncio.gather(
            *(self._complete(messages) for _ in range(m)), return_exceptions=True
        )
        out: list[str | JudgeError] = []
        for r in results:
            if isinstance(r, JudgeError | str):
                out.append(r)
            elif isinstance(r, BaseException):
                out.append(JudgeError(f"{type(r).__name__}: {r}"))
        return out

    async def score(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        response_token_ids: list[int],
    ) -> list[float]:
        """Log-probs of exactly these response token ids after the chat prompt of `messages`:
        the prompt is tokenised by the server's own chat template (`/tokenize`), the response
        ids are appended untouched and scored with `prompt_logprobs` (vLLM's protocol)."""
        model = await self.model()
        tokenized = await self._post(
            f"{self.root}/tokenize",
            {"model": model, "messages": messages, "tools": tools, "add_generation_prompt": True},
        )
        prompt = [int(t) for t in tokenized["tokens"]] + list(response_token_ids)
        body = await self._post(
            f"{self.base}/completions",
            {
                "model": model,
                "prompt": prompt,
                "max_tokens": 1,
                "temperature": 0.0,
                "prompt_logprobs": 0,
            },
        )
        entries = body["choices"][0]["prompt_logprobs"][-len(response_token_ids) :]
        return [
            min(0.0, max(float(entry[str(token)]["logprob"]), -1e4))
            for token, entry in zip(response_token_ids, entries, strict=True)
        ]

    async def teacher_logprobs(self, turn: Turn, hint: str) -> list[float]:
        """The step's own response tokens under its prompt with the hint appended."""
        messages = [m.model_dump(exclude_none=True) for m in teacher_messages(turn, hint)]
        step = turn.step
        return await self.score(messages, step.request.tools, step.response_token_ids)

    async def judge(self, turn: Turn) -> JudgeOutcome:
        config = self.config
        errors: list[str] = []
        prm_votes: list[Vote] = []
        prm_raw: list[str] = []
        prm_score: Vote | None = None
        if config.prm_votes and turn.next_state:
            answers = await self._votes(prm_messages(turn), config.prm_votes)
            parsed: list[Vote | None] = []
            for a in answers:
                if isinstance(a, JudgeError):
                    errors.append(str(a))
                    continue
                vote = parse_vote(a)
                parsed.append(vote)
                prm_votes.append(vote if vote is not None else 0)
                prm_raw.append(a)
            if parsed:
                prm_score = majority(parsed)
        hint_votes: list[HintVote] = []
        hint: str | None = None
        teacher: list[float] | None = None
        if config.needs_hints and turn.next_state:
            answers = await self._votes(opd_messages(turn), config.hint_votes)
            for a in answers:
                if isinstance(a, JudgeError):
                    errors.append(str(a))
                    continue
                hint_votes.append(parse_hint(a))
            hint = choose_hint(hint_votes)
            if hint is not None:
                try:
                    teacher = await self.teacher_logprobs(turn, hint)
                except REQUEST_ERRORS as exc:
                    errors.append(f"teacher logprobs: {type(exc).__name__}: {exc}")
        judgement = Judgement(
            judgement_id=judgement_id_of(turn),
            session_id=turn.session_id,
            turn=turn,
            judge_model=self._model or config.judge_model or "",
            prm_votes=prm_votes,
            prm_raw=prm_raw,
            prm_score=prm_score,
            hint_votes=hint_votes,
            hint=hint,
            teacher_logprobs=teacher,
        )
        return JudgeOutcome(judgement, errors)
