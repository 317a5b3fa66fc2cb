"""The judge: PRM votes and OPD hints from an OpenAI-compatible server, teacher log-probs.

Votes run in parallel under one concurrency cap per worker; each request has a timeout and
is retried (tenacity) on connection errors, timeouts and 5xx/429. A vote that still fails is
reported as an error and counts as no vote. The client is aiohttp: httpx cost about a quarter
of a worker's CPU in the pipeline benchmark (as it did on the gateway's hot path).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import aiohttp
import orjson
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from claw_stream.api.reward_source import RewardSource
from claw_stream.events import HintVote, Judgement, SourceScore, Turn
from claw_stream.ids import judgement_id_of
from claw_stream.names import Vote
from claw_stream.skills.text import carried_block
from claw_stream.worker.config import WorkerSettings
from claw_stream.worker.logic.judge_prompts import (
    HINT_STOPS,
    OPD_SYSTEM,
    PRM_SYSTEM,
    VOTE_STOPS,
    choose_hint,
    judge_prompt,
    majority,
    parse_hint,
    parse_vote,
    served_messages,
    shows_thinking,
    teacher_messages,
    with_stop,
)
from claw_stream.worker.prompt_files import JudgePrompts, load_prompts
from claw_stream.worker.reward_sources import load_sources, score_all

log = logging.getLogger(__name__)
DEFAULT_CONTEXT = 32768  # when neither the settings nor the server say
JSON_BODY = {"Content-Type": "application/json"}
REQUEST_ERRORS = (aiohttp.ClientError, TimeoutError, KeyError, IndexError, ValueError)


class JudgeError(RuntimeError):
    """A judge request that failed after its retries. `busy`: it timed out, or the server was
    unreachable or overloaded (5xx, 429), which says nothing about the turn: it is judged
    again later (`Judger.on_turn`), where a malformed answer is not."""

    def __init__(self, message: str, busy: bool = False, timeout: bool = False):
        super().__init__(message)
        self.busy = busy or timeout
        self.timeout = timeout


def _failure(exc: BaseException) -> JudgeError:
    return JudgeError(
        f"{type(exc).__name__}: {exc}",
        busy=_retryable(exc),
        timeout=isinstance(exc, TimeoutError),
    )


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, aiohttp.ClientResponseError):
        return exc.status >= 500 or exc.status == 429
    return isinstance(exc, aiohttp.ClientConnectionError | TimeoutError)


@dataclass
class JudgeOutcome:
    judgement: Judgement
    errors: list[str] = field(default_factory=list)  # requests that failed after retries
    busy: bool = False  # some failed as the judge's timeouts or load: worth judging again
    timeouts: int = 0


def _template_kwargs(turn: Turn) -> dict[str, Any] | None:
    variables = turn.step.request.extra.get("chat_template_kwargs")
    return variables if isinstance(variables, dict) else None


class JudgeClient:
    def __init__(
        self,
        config: WorkerSettings,
        prompts: JudgePrompts | None = None,
        sources: list[RewardSource] | None = None,
    ):
        """Create it inside the running event loop (aiohttp binds its session to it).
        `prompts` and `sources`: loaded from `config` when not given (`load_prompts`,
        `load_sources`, which fail on a bad prompt file or plugin)."""
        self.config = config
        self.prompts = prompts if prompts is not None else load_prompts(config)
        self.sources = sources if sources is not None else load_sources(config)
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
        self.in_flight = 0  # requests sent or waiting for a slot (the judge's queue, /metrics)
        self._model: str | None = config.judge_model
        self._context: int | None = config.judge_context_tokens
        # off for good once an answer shows the stops cannot be trusted with this judge
        self.stop_at_verdict = config.judge_stop_at_verdict
        # judge_max_tokens for every vote once an answer shows thinking (or the settings say)
        self.thinks = bool(config.judge_thinks)
        self._not_distilled = ""  # why the last skills were not distilled (warned once each)

    async def aclose(self) -> None:
        await self.http.close()
        for source in self.sources:
            await source.aclose()

    async def _post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        # orjson both ways: aiohttp's stdlib json encoding of the judge prompt was a quarter of
        # this call's CPU in bench/pipeline_bench.py
        data = orjson.dumps(body)
        try:
            return await self._post_once(url, data)
        except Exception as exc:
            if not _retryable(exc):
                raise
            first = exc
        # Tenacity only once the first attempt failed: setting it up and stepping it for every
        # request was ~7% of the worker's CPU in bench/pipeline_bench.py. The first failure is
        # its attempt 1, so the waits and the number of attempts are as they were.
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(self.config.judge_retries + 1),
            wait=wait_exponential(multiplier=0.5, max=10) + wait_random(0, 0.5),
            retry=retry_if_exception(_retryable),
            reraise=True,
        ):
            with attempt:
                if attempt.retry_state.attempt_number == 1:
                    raise first
                return await self._post_once(url, data)
        raise AssertionError("unreachable")

    async def _post_once(self, url: str, data: bytes) -> dict[str, Any]:
        self.in_flight += 1
        try:
            async with self.slots, self.http.post(url, data=data, headers=JSON_BODY) as response:
                return cast(dict[str, Any], orjson.loads(await response.read()))
        finally:
            self.in_flight -= 1

    async def model(self) -> str:
        if self._model is None or self._context is None:
            async with self.http.get(f"{self.base}/models") as response:
                data = (await response.json(content_type=None))["data"]
            entry = next((d for d in data if d.get("id") == self._model), data[0])
            self._model = self._model or entry["id"]
            self._context = self._context or int(entry.get("max_model_len") or DEFAULT_CONTEXT)
        assert self._model is not None
        return self._model

    async def budget(self) -> tuple[int, int]:
        """(prompt characters, reserve) that fit the judge's context: the answer gets
        `judge_max_tokens` but at most half of the context (the reserve), the prompt the rest.
        A plain judge is given less (`room`), but its prompt is bounded alike, so that the
        same prompt fits once an answer shows it thinks."""
        try:
            await self.model()
        except REQUEST_ERRORS:
            if self._model is None:
                raise
            self._context = None  # the votes report the unreachable server, one error each
        context = self._context or DEFAULT_CONTEXT
        reserve = min(self.config.judge_max_tokens, context // 2)
        return int((context - reserve - 32) * self.config.judge_chars_per_token), reserve

    def room(self, reserve: int) -> int:
        """max_tokens of a vote, given the `reserve` its prompt leaves: all of it for a judge
        that thinks, judge_plain_max_tokens for one that has shown no thinking. SmolLM2-135M
        seldom writes its box and ran on to the 4,096 a vote allowed (77 s a turn on 2 cores,
        bench/judge_agreement_bench.py)."""
        return reserve if self.thinks else min(reserve, self.config.judge_plain_max_tokens)

    async def _complete(
        self, messages: list[dict[str, Any]], reserve: int, n: int, stops: tuple[str, ...]
    ) -> list[str]:
        """Up to `n` answers to one prompt in one request (fewer where the server ignores `n`),
        each ending at the first of `stops` it meets while this judge's stops are trusted."""
        stopping = self.stop_at_verdict and bool(stops)
        max_tokens = self.room(reserve)
        try:
            body = await self._post(
                f"{self.base}/chat/completions",
                {
                    "model": await self.model(),
                    "messages": messages,
                    "temperature": self.config.judge_temperature,
                    "max_tokens": max_tokens,
                    **({"n": n} if n > 1 else {}),
                    **({"stop": list(stops)} if stopping else {}),
                },
            )
            choices = body["choices"][:n]
            if (
                self.config.judge_thinks is None
                and not self.thinks
                and any(shows_thinking(c) for c in choices)
            ):
                self.thinks = True
                log.info(
                    "the judge thinks before its verdict: its votes get worker.judge_max_tokens "
                    "(%d) from now",
                    reserve,
                )
                if max_tokens < reserve and any(
                    c.get("finish_reason") == "length" for c in choices
                ):
                    return await self._complete(messages, reserve, n, stops)
            if stopping:
                kept = [with_stop(c, stops) for c in choices]
            else:
                kept = [c["message"].get("content") or "" for c in choices]
        except REQUEST_ERRORS as exc:
            raise _failure(exc) from exc
        if not kept:
            raise JudgeError("the judge answered with no choices")
        answers = [a for a in kept if a is not None]
        if len(answers) < len(kept):
            self.stop_at_verdict = False
            log.info(
                "the judge met a stop inside its thinking, or its server does not name the stop "
                "it met: its answers go on to their end from now (worker.judge_stop_at_verdict)"
            )
            return await self._complete(messages, reserve, n, stops)
        return answers

    async def _votes(
        self, messages: list[dict[str, Any]], m: int, reserve: int, stops: tuple[str, ...]
    ) -> list[str | JudgeError]:
        """`m` answers, asked for at once with `n` as OpenAI's and vLLM's servers take it: one
        request instead of m (in bench/pipeline_bench.py the judge's HTTP was a sixth of the
        worker's CPU with one request per vote), and the judge reads the prompt once. A server
        that returns fewer choices (llama.cpp's ignores `n`) is asked again for the rest; a
        request that fails costs each vote it was asked for, reported one error per vote."""
        out: list[str | JudgeError] = []
        while len(out) < m:  # each pass adds at least one answer or error
            try:
                out += await self._complete(messages, reserve, m - len(out), stops)
            except JudgeError as exc:
                out += [exc] * (m - len(out))
            except Exception as exc:  # a malformed answer: an error per vote, never a crash
                out += [JudgeError(f"{type(exc).__name__}: {exc}")] * (m - len(out))
        return out

    async def score(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        response_token_ids: list[int],
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[float]:
        """Log-probs of exactly these response token ids after the chat prompt of `messages`:
        the prompt is tokenised by the server's own chat template (`/tokenize`, with the
        template's variables as serving had them), the response ids are appended untouched
        and scored with `prompt_logprobs` (vLLM's protocol)."""
        model = await self.model()
        prompt = await self.tokenize(messages, tools, template_kwargs) + list(response_token_ids)
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

    async def tokenize(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any] | None = None,
        retry: bool = True,
    ) -> list[int]:
        """The chat prompt of `messages` as the server's own template renders it (`/tokenize`,
        with the template's variables as serving had them)."""
        body = {
            "model": await self.model(),
            "messages": messages,
            "tools": tools,
            "add_generation_prompt": True,
            **({"chat_template_kwargs": template_kwargs} if template_kwargs else {}),
        }
        url = f"{self.root}/tokenize"
        if retry:
            tokenized = await self._post(url, body)
        else:
            tokenized = await self._post_once(url, orjson.dumps(body))
        return [int(t) for t in tokenized["tokens"]]

    async def teacher_logprobs(self, turn: Turn, hint: str) -> list[float]:
        """The step's own response tokens under its prompt as served (with the skills its call
        carried) and the hint appended, rendered with the chat-template variables its request
        was served with (a thinking model's `enable_thinking`: without them the teacher read
        another prompt than the policy)."""
        step = turn.step
        skills = carried_block(step.request.extra)
        messages = [m.model_dump(exclude_none=True) for m in teacher_messages(turn, hint, skills)]
        return await self.score(
            messages, step.request.tools, step.response_token_ids, _template_kwargs(turn)
        )

    async def prompt_without_skills(self, turn: Turn) -> list[int] | None:
        """The prompt of a step whose call carried skills, without them: the Step's own
        messages rendered as serving rendered them. None where it carried none, or where this
        server renders the prompt with the skills otherwise than the engine did (a judge of
        another model): its token ids would not be the policy's."""
        step = turn.step
        skills = carried_block(step.request.extra)
        if skills is None or not step.prompt_token_ids:
            return None
        tools, variables = step.request.tools, _template_kwargs(turn)
        served = [m.model_dump(exclude_none=True) for m in served_messages(turn, skills)]
        plain = [m.model_dump(exclude_none=True) for m in step.request.messages]
        try:  # once, no retries: a turn never waits on this, it trains with its skills instead
            if await self.tokenize(served, tools, variables, retry=False) == step.prompt_token_ids:
                return await self.tokenize(plain, tools, variables, retry=False)
            why = (
                "the judge renders prompts otherwise than the policy's engine did (another "
                "model?); worker.distil_skills needs the policy's model as the judge"
            )
        except REQUEST_ERRORS as exc:
            why = f"the judge could not render the prompt ({type(exc).__name__}: {exc})"
        if why != self._not_distilled:
            self._not_distilled = why
            log.warning("a call's skills are trained with it, not distilled: %s", why)
        return None

    async def judge(
        self,
        turn: Turn,
        feedback: list[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> JudgeOutcome:
        """PRM votes and OPD hints on `turn`, and the other reward sources' scores (given the
        session's `metadata`) at the same time; `feedback`: what the user wrote about the
        answer (`/rl/feedback` text), evidence beside the next state for both."""
        scoring = asyncio.ensure_future(score_all(self.sources, turn, metadata or {}))
        try:
            outcome = await self._judge(turn, feedback)
        except BaseException:
            scoring.cancel()
            raise
        scores = await scoring
        outcome.errors += [f"reward source {s.source}: {s.error}" for s in scores if s.error]
        judgement = outcome.judgement
        rewards = list(judgement.rewards) + scores
        outcome.judgement = judgement.model_copy(update={"rewards": rewards})
        return outcome

    async def _judge(self, turn: Turn, feedback: list[str] | None = None) -> JudgeOutcome:
        config = self.config
        n_prm = config.prm_vote_count
        prm = config.prm_source
        errors: list[str] = []
        prm_votes: list[Vote] = []
        prm_raw: list[str] = []
        prm_score: Vote | None = None
        evidence = bool(turn.next_state or feedback)
        failures: list[JudgeError] = []
        history_cut = 0
        budget, reserve = 0, config.judge_max_tokens
        if (n_prm or config.needs_hints) and evidence:
            try:
                budget, reserve = await self.budget()
            except REQUEST_ERRORS as exc:
                failures.append(_failure(exc))
                errors.append(f"judge models: {failures[-1]}")
                evidence = False
        if n_prm and evidence:
            prompt = judge_prompt(PRM_SYSTEM, turn, budget, feedback, self.prompts.prm)
            history_cut = prompt.history_cut
            answers = await self._votes(prompt.messages, n_prm, reserve, VOTE_STOPS)
            parsed: list[Vote | None] = []
            for a in answers:
                if isinstance(a, JudgeError):
                    failures.append(a)
                    errors.append(str(a))
                    continue
                vote = parse_vote(a)
                parsed.append(vote)
                prm_votes.append(vote if vote is not None else 0)
                prm_raw.append(a)
            if parsed:
                prm_score = majority(parsed, prm.threshold if prm else None)
        hint_votes: list[HintVote] = []
        hint: str | None = None
        teacher: list[float] | None = None
        if config.needs_hints and evidence:
            prompt = judge_prompt(OPD_SYSTEM, turn, budget, feedback, self.prompts.hint)
            history_cut = max(history_cut, prompt.history_cut)
            answers = await self._votes(prompt.messages, config.hint_votes, reserve, HINT_STOPS)
            for a in answers:
                if isinstance(a, JudgeError):
                    failures.append(a)
                    errors.append(str(a))
                    continue
                hint_votes.append(parse_hint(a))
            hint = choose_hint(hint_votes)
            if hint is not None:
                try:
                    teacher = await self.teacher_logprobs(turn, hint)
                except REQUEST_ERRORS as exc:
                    failures.append(_failure(exc))
                    errors.append(f"teacher logprobs: {failures[-1]}")
        plain = await self.prompt_without_skills(turn) if config.distil_skills else None
        judgement = Judgement(
            judgement_id=judgement_id_of(turn.turn_id),
            session_id=turn.session_id,
            turn=turn,
            judge_model=self._model or config.judge_model or "",
            prm_votes=prm_votes,
            prm_raw=prm_raw,
            prm_score=prm_score,
            hint_votes=hint_votes,
            hint=hint,
            teacher_logprobs=teacher,
            prompt_without_skills=plain,
            feedback_text="\n".join(feedback) if feedback else None,
            history_cut=history_cut,
            rewards=[SourceScore(source=prm.source_name, score=float(prm_score))]
            if prm is not None and prm_score is not None
            else [],
        )
        return JudgeOutcome(
            judgement,
            errors,
            busy=any(f.busy for f in failures),
            timeouts=len({id(f) for f in failures if f.timeout}),  # one per request
        )
