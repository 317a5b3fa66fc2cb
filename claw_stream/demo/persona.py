"""The scripted persona: the questions it asks, its rule (answers under `max_words` words, or,
for a persona who `wants` long ones, at least that many) and its episodes through the gateway,
thumbs on every answer."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import httpx
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from claw_stream.demo.tally import LiveAnswer

QUESTIONS = [
    "Explain how a rainbow forms.",
    "Why is the sky blue?",
    "What does a compiler do?",
    "How do vaccines work?",
    "What is photosynthesis?",
    "Why do we have seasons?",
    "How does a refrigerator keep food cold?",
    "What is the difference between weather and climate?",
    "How do airplanes stay in the air?",
    "What causes earthquakes?",
    "How does the internet send a message?",
    "Why do cats purr?",
]


# never asked in an episode: the held-out set every served version answers (`HeldOut`)

# SmolLM2-135M's v0 answered the 24 held-out questions so framed in 14 to 48 words, 14 of them
# under 30 (64 tokens, each its own seed; measured): a persona who wants short answers and one
# who wants long ones both have room to move, where unframed answers all ran past 64 tokens
ASK_BRIEFLY = "In one or two sentences: "


@dataclass(frozen=True)
class Persona:
    max_words: int = 30
    wants: Literal["short", "long"] = "short"  # two users of opposite tastes: one of each
    framing: str = ""  # said before each question (ASK_BRIEFLY: answers either side of 30)

    def ask(self, question: str) -> str:
        return self.framing + question

    def is_short(self, answer: str) -> bool:
        return 0 < len(answer.split()) < self.max_words

    def likes(self, answer: str) -> bool:
        """Its thumbs: up for an answer of the length it wants (an empty one never)."""
        if self.wants == "short":
            return self.is_short(answer)
        return len(answer.split()) >= self.max_words

    def reply(self, liked: bool) -> str:
        if liked:
            return "Thanks, that is just the right length."
        if self.wants == "short":
            return f"That is too long. Please answer in under {self.max_words} words."
        return f"That is too short. Please explain in more detail, {self.max_words} words or more."


def _skills(on: bool) -> dict[str, str]:
    return {} if on else {"X-Claw-Skills": "off"}


async def start_session(
    http: httpx.AsyncClient, admin_key: str, train: bool = True, tenant: str | None = None
) -> tuple[str, str]:
    """A new session started with the admin key (for `tenant`, whose adapter serves it where
    it has one): its id and its key."""
    body: dict[str, object] = {} if train else {"train": False}
    if tenant is not None:
        body["tenant"] = tenant
    started = await http.post(
        "/rl/start_session", headers={"Authorization": f"Bearer {admin_key}"}, json=body
    )
    started.raise_for_status()
    return started.json()["session_id"], started.json()["api_key"]


async def _answered(
    client: AsyncOpenAI,
    http: httpx.AsyncClient,
    auth: dict[str, str],
    model: str,
    messages: list[ChatCompletionMessageParam],
    persona: Persona,
    max_tokens: int,
    on_answer: Callable[[list[LiveAnswer]], None] = lambda answers: None,
) -> tuple[LiveAnswer, str]:
    """One answer to the conversation so far, judged by the persona's rule (told to
    `on_answer` first), and its thumbs up or down sent as feedback on the answer's Step."""
    raw = await client.chat.completions.with_raw_response.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=1.0
    )
    text = raw.parse().choices[0].message.content or ""
    reward = 1.0 if persona.likes(text) else -1.0
    answer = LiveAnswer(
        int(raw.headers.get("x-claw-weight-version", "0")),
        len(text.split()),
        persona.is_short(text),
        reward,
    )
    on_answer([answer])
    feedback = await http.post(
        "/rl/feedback",
        headers=auth,
        json={"score": int(reward), "step_id": raw.headers["x-claw-step-id"]},
    )
    feedback.raise_for_status()
    return answer, text


async def play_episode(
    gateway: str,
    admin_key: str,
    model: str,
    persona: Persona,
    rng: random.Random,
    turns: int = 2,
    max_tokens: int = 64,
    tenant: str | None = None,
    skills: bool = True,
) -> list[LiveAnswer]:
    """One session with its own key: `turns` questions, thumbs on each answer, then the end.
    `skills`: its calls carry the user's skills (`X-Claw-Skills: off` otherwise)."""
    async with httpx.AsyncClient(base_url=gateway, timeout=300) as http:
        _, key = await start_session(http, admin_key, tenant=tenant)
        auth = {"Authorization": f"Bearer {key}"}
        client = AsyncOpenAI(
            base_url=f"{gateway}/v1", api_key=key, max_retries=2, default_headers=_skills(skills)
        )
        messages: list[ChatCompletionMessageParam] = [
            {"role": "user", "content": persona.ask(rng.choice(QUESTIONS))}
        ]
        answers = []
        try:
            for turn in range(turns):
                answer, text = await _answered(
                    client, http, auth, model, messages, persona, max_tokens
                )
                answers.append(answer)
                messages.append({"role": "assistant", "content": text})
                follow = persona.reply(answer.reward > 0)
                if turn + 1 < turns:
                    follow += " " + persona.ask(rng.choice(QUESTIONS))
                messages.append({"role": "user", "content": follow})
            (await http.post("/rl/end_session", headers=auth, json={})).raise_for_status()
        finally:
            await client.close()
        return answers


async def play_conversation(
    gateway: str,
    admin_key: str,
    model: str,
    persona: Persona,
    rng: random.Random,
    n_answers: int,
    *,
    pause_every: int = 6,
    pause_s: float = 0.0,
    window: int = 8,
    max_tokens: int = 64,
    on_answers: Callable[[list[LiveAnswer]], None] = lambda answers: None,
    tenant: str | None = None,
    skills: bool = True,
) -> list[LiveAnswer]:
    """The continuous persona: one session that never ends, the way a personal agent is used.
    One key, `n_answers` questions in one conversation with thumbs on each answer and a pause
    of `pause_s` (longer than the worker's idle timeout) every `pause_every` answers; the agent
    keeps the last `window` messages of the history (its own compaction). No end_session."""
    async with httpx.AsyncClient(base_url=gateway, timeout=300) as http:
        _, key = await start_session(http, admin_key, tenant=tenant)
        auth = {"Authorization": f"Bearer {key}"}
        client = AsyncOpenAI(
            base_url=f"{gateway}/v1", api_key=key, max_retries=2, default_headers=_skills(skills)
        )
        messages: list[ChatCompletionMessageParam] = [
            {"role": "user", "content": persona.ask(rng.choice(QUESTIONS))}
        ]
        answers: list[LiveAnswer] = []
        try:
            for k in range(n_answers):
                answer, text = await _answered(
                    client, http, auth, model, messages, persona, max_tokens, on_answers
                )
                answers.append(answer)
                messages.append({"role": "assistant", "content": text})
                messages.append(
                    {
                        "role": "user",
                        "content": persona.reply(answer.reward > 0)
                        + " "
                        + persona.ask(rng.choice(QUESTIONS)),
                    }
                )
                messages = messages[-window:] if len(messages) > window else messages
                if pause_s and (k + 1) % pause_every == 0:
                    await asyncio.sleep(pause_s)  # the worker closes the segment meanwhile
        finally:
            await client.close()
        return answers
