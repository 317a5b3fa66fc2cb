"""The replay's judge: an OpenAI-compatible server asked, per pair, m votes in each order (the
worker's judge by default, `eval.judge_url` for a separate one)."""

from __future__ import annotations

import asyncio

from openai import APIError, AsyncOpenAI

from claw_stream.evaluation.replay.pairs import (
    HeldOutTurn,
    Order,
    Preference,
    judged,
    pair_messages,
    parse_preference,
)

ORDERS: tuple[Order, Order] = ("new_first", "old_first")


class PairJudge:
    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        votes: int = 1,
        api_key: str = "none",
        concurrency: int = 8,
    ):
        # retries on connection errors, 429 and 5xx are the SDK's
        self.client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=3, timeout=300)
        self.model = model
        self.votes = votes
        self._slots = asyncio.Semaphore(concurrency)

    async def __aenter__(self) -> PairJudge:
        if self.model is None:
            self.model = (await self.client.models.list()).data[0].id
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()

    @property
    def name(self) -> str:
        return self.model or "?"

    async def score(self, turn: HeldOutTurn, new_answer: str) -> tuple[float | None, int]:
        """The new answer's score against the one the user got: the mean of the votes that
        parsed, both orders (None: none did), and how many."""
        asked = [(order, i) for order in ORDERS for i in range(self.votes)]
        picks = await asyncio.gather(*(self._vote(turn, new_answer, o, i) for o, i in asked))
        return judged(zip(picks, [o for o, _ in asked], strict=True))

    async def _vote(
        self, turn: HeldOutTurn, new_answer: str, order: Order, i: int
    ) -> Preference | None:
        async with self._slots:
            try:
                done = await self.client.chat.completions.create(
                    model=self.name,
                    messages=pair_messages(turn, new_answer, order),  # type: ignore[arg-type]
                    max_tokens=4,
                    temperature=0.0 if self.votes == 1 else 1.0,
                    seed=i,
                )
            except APIError:  # after the SDK's retries: no vote
                return None
        return parse_preference(done.choices[0].message.content or "")
