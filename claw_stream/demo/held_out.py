"""The held-out questions every version the demo serves answers, scored by the persona's rule."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from types import TracebackType

import httpx
from openai import AsyncOpenAI

from claw_stream.demo.persona import Persona, start_session
from claw_stream.demo.tally import HeldOutAnswer, Tally
from claw_stream.names import policy_model

HELD_OUT_QUESTIONS = [
    "What is a black hole?",
    "How do bees make honey?",
    "Why does ice float on water?",
    "What does a database index do?",
    "How do noise-cancelling headphones work?",
    "Why do leaves change colour in autumn?",
    "What is inflation in economics?",
    "How does a battery store energy?",
    "Why does bread rise?",
    "What is a prime number?",
    "How do tides work?",
    "What does DNA do in a cell?",
    "Why do we dream?",
    "How does GPS know where I am?",
    "What is the greenhouse effect?",
    "How do muscles grow stronger?",
    "What is an API?",
    "Why is the ocean salty?",
    "How does a microwave oven heat food?",
    "What causes thunder?",
    "How do birds migrate?",
    "What is a neural network?",
    "Why do onions make people cry?",
    "How does a solar panel make electricity?",
]


class HeldOut:
    """Every version the demo serves answers the same held-out questions, each with the same
    seed, and the persona's rule scores them: each point of the curve has the same number of
    answers, to the same questions.

    The calls are side calls (`X-Turn-Type: side`) of one session of their own whose training
    is off (`train: false`): never trained, never judged, never the persona's traffic. A
    version is scored when the demo's answers first show it (`saw`), and once more at the end;
    a set that a new version interrupted is asked again of the new one. Versions that come
    while a set is being answered are not scored (the next set is the newest's): on 2 CPU cores
    a set of 24 answers took ~50 s beside the trainer, and a version came every ~15 s.
    """

    def __init__(
        self,
        gateway: str,
        admin_key: str,
        model: str,
        persona: Persona,
        tally: Tally,
        questions: Sequence[str] = HELD_OUT_QUESTIONS,
        *,
        concurrency: int | None = None,
        max_tokens: int = 64,
        every: int = 1,
        tenant: str | None = None,
        skills: bool = False,
    ):
        self.gateway = gateway
        self.admin_key = admin_key
        self.model = model
        self.persona = persona
        self.tally = tally
        self.questions = list(questions)
        self.max_tokens = max_tokens
        self.tenant = tenant  # asked of the tenant's adapter where it has one
        # asked with the user's skills (the tenant's and everyone's), scored apart
        self.skills = skills
        self.scored = tally.held_out_skills if skills else tally.held_out
        # all at once by default: the engine decodes them in one batch (up to its max_batch)
        self._slots = asyncio.Semaphore(concurrency or len(self.questions))
        self.every = every  # score a version this many past the last one scored, or newer
        self._wanted = 0  # the newest version the demo's answers showed
        self._following: asyncio.Task[None] | None = None
        self._client: AsyncOpenAI | None = None
        self.session_id: str | None = None  # the session its calls are filed under
        self._split = False  # the last set was answered by more than one version

    async def __aenter__(self) -> HeldOut:
        async with httpx.AsyncClient(base_url=self.gateway, timeout=60) as http:
            self.session_id, key = await start_session(
                http, self.admin_key, train=False, tenant=self.tenant
            )
        self.tally.held_out_session = self.session_id
        self._client = AsyncOpenAI(
            base_url=f"{self.gateway}/v1",
            api_key=key,
            max_retries=2,
            timeout=300,
            default_headers={
                "X-Turn-Type": "side",
                "X-Claw-Skills": "on" if self.skills else "off",
            },
        )
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._following is not None:
            self._following.cancel()
        if self._client is not None:
            await self._client.close()

    def saw(self, version: int) -> None:
        """The demo was served `version`: score it, unless it is (being) scored already or
        is fewer than `every` versions past the last one scored."""
        if version < max(self.scored, default=0) + self.every:
            return
        self._wanted = max(self._wanted, version)
        if self._following is None or self._following.done():
            self._following = asyncio.ensure_future(self._follow())

    async def finish(self) -> None:
        """Wait for the scoring under way, then score the version serving now if it is new
        (asked again, up to 3 times, while a version the trainer pushed meanwhile splits the
        set)."""
        if self._following is not None:
            await self._following
        for _ in range(3):
            before = set(self.scored)
            await self.score()
            if set(self.scored) - before or not self._split:
                return

    async def _follow(self) -> None:
        tries = 0
        while max(self.scored, default=-1) < self._wanted and tries < 3:
            scored = len(self.scored)
            await self.score()
            tries = 0 if len(self.scored) > scored else tries + 1

    async def score(self) -> None:
        """Ask every held-out question of the version serving now, all at once: the engine
        takes them into one batch, so one version answers them all. (A first question asked
        alone, to see whether the version was scored already, came back ~20 s later beside
        the persona's calls and the trainer; a new version had come meanwhile, and the set was
        split across two versions, both incomplete.)"""
        answers = await asyncio.gather(*(self._ask(i) for i in range(len(self.questions))))
        by: dict[int, list[HeldOutAnswer]] = defaultdict(list)
        for answer in answers:
            by[answer.version].append(answer)
        for version, those in by.items():  # a new version mid-set leaves two partial sets
            if len(those) == len(self.questions) and version not in self.scored:
                self.scored[version] = those
        self._split = len(by) > 1

    async def _ask(self, i: int) -> HeldOutAnswer:
        assert self._client is not None, "use HeldOut in `async with`"
        async with self._slots:
            raw = await self._client.chat.completions.with_raw_response.create(
                model=self.model,
                messages=[{"role": "user", "content": self.persona.ask(self.questions[i])}],
                max_tokens=self.max_tokens,
                temperature=1.0,  # as the persona's own calls: the policy it trains
                seed=i,  # the same draw for every version: their differences are the weights'
            )
        text = raw.parse().choices[0].message.content or ""
        return HeldOutAnswer(
            i,
            int(raw.headers.get("x-claw-weight-version", "0")),
            len(text.split()),
            self.persona.is_short(text),
            self.persona.likes(text),
        )


async def answered_now(
    gateway: str,
    admin_key: str,
    persona: Persona,
    questions: Sequence[str] = HELD_OUT_QUESTIONS,
    *,
    tenant: str | None = None,
) -> tuple[int, list[HeldOutAnswer]]:
    """The held-out set asked once of what serves `tenant` now (its newest adapter; None: the
    shared policy): the version that answered it whole, and its answers. A version that came
    mid-set splits it: asked again (`HeldOut.finish`, up to 3 times)."""
    async with httpx.AsyncClient(base_url=gateway, timeout=30) as http:
        listed = await http.get("/v1/models", headers={"Authorization": f"Bearer {admin_key}"})
    model = policy_model(listed.raise_for_status().json()["data"])
    tally = Tally()
    async with HeldOut(gateway, admin_key, model, persona, tally, questions, tenant=tenant) as s:
        await s.finish()
    if not tally.held_out:
        raise RuntimeError("new versions kept coming while the held-out set was answered")
    version = max(tally.held_out)
    return version, tally.held_out[version]
