"""A demo: the persona's episodes (or never-ending conversations), the held-out set scored
beside them."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from typing import Literal

import httpx

from claw_stream.demo.held_out import HeldOut
from claw_stream.demo.persona import Persona, play_conversation, play_episode
from claw_stream.demo.tally import LiveAnswer, Tally
from claw_stream.names import policy_model

Learn = Literal["weights", "skills", "both"]
SKILLS_USER = "demo-user"  # the tenant whose skills the persona teaches, unless it has one


async def run_demo(
    gateway: str,
    admin_key: str,
    episodes: int,
    *,
    concurrency: int = 4,
    persona: Persona | None = None,
    seed: int = 0,
    on_answers: Callable[[list[LiveAnswer]], None] = lambda answers: None,
    continuous: bool = False,
    pause_s: float = 0.0,
    held_out: Sequence[str] | None = None,
    held_out_every: int = 1,
    tenant: str | None = None,
    max_tokens: int = 64,
    learn: Learn = "weights",
    skills_wait_s: float = 120.0,
) -> Tally:
    """`episodes` episodes of two answers each; `continuous`: as many answers in `concurrency`
    never-ending conversations with idle pauses (`play_conversation`). With `held_out`
    questions, the version serving first and every later one the episodes show answer them
    (`HeldOut`, in `Tally.held_out`), or every `held_out_every`-th. With `tenant`, every
    session is the tenant's: its adapter answers once the trainer made one.

    `learn`: what the persona's calls learn from, the weights (they carry no skills), its
    skills, or both. With skills (where the gateway's `skills.enabled`), its sessions are one
    user's (`tenant`, else SKILLS_USER) and at the end, once the worker kept a skill of theirs
    (or after `skills_wait_s`), the held-out set is asked again with them
    (`Tally.held_out_skills`)."""
    persona = persona or Persona()
    skills = learn != "weights" and await skills_enabled(gateway, admin_key)
    user = tenant or (SKILLS_USER if skills else None)
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=30) as http:
        admin = {"Authorization": f"Bearer {admin_key}"}  # a gateway with a client key asks one
        models = (await http.get(f"{gateway}/v1/models", headers=admin)).json()["data"]
    model = policy_model(models)
    tally = Tally()

    async def play(report: Callable[[list[LiveAnswer]], None]) -> None:
        await _play(
            gateway,
            admin_key,
            model,
            persona,
            rng,
            episodes,
            concurrency,
            tally,
            report,
            continuous,
            pause_s,
            user,
            max_tokens,
            skills,
        )

    if held_out is None:
        await play(on_answers)
        return tally
    async with HeldOut(
        gateway,
        admin_key,
        model,
        persona,
        tally,
        held_out,
        every=held_out_every,
        tenant=tenant,
        max_tokens=max_tokens,
    ) as scoring:
        await scoring.score()  # the baseline, before anything trains

        def seen(answers: list[LiveAnswer]) -> None:
            scoring.saw(max(a.version for a in answers))
            on_answers(answers)

        await play(seen)
        await scoring.finish()
    if skills:
        await wait_for_skills(gateway, admin_key, user, skills_wait_s)
        async with HeldOut(
            gateway,
            admin_key,
            model,
            persona,
            tally,
            held_out,
            tenant=user,
            max_tokens=max_tokens,
            skills=True,
        ) as with_skills:
            await with_skills.finish()
    return tally


async def skills_enabled(gateway: str, admin_key: str) -> bool:
    """Whether the gateway's calls carry skills (`skills.enabled`)."""
    async with httpx.AsyncClient(base_url=gateway, timeout=30) as http:
        answer = await http.get(
            "/rl/skills",
            params={"anonymous": "true"},
            headers={"Authorization": f"Bearer {admin_key}"},
        )
    return bool(answer.raise_for_status().json()["enabled"])


async def wait_for_skills(gateway: str, admin_key: str, tenant: str | None, wait_s: float) -> int:
    """The user's active skills, once they have one (the worker learns after judging) or
    `wait_s` passed: how many."""
    deadline = time.monotonic() + wait_s
    async with httpx.AsyncClient(base_url=gateway, timeout=30) as http:
        while True:
            answer = await http.get(
                "/rl/skills",
                params={"tenant": tenant} if tenant else {"anonymous": "true"},
                headers={"Authorization": f"Bearer {admin_key}"},
            )
            found = len(answer.raise_for_status().json()["skills"])
            if found or time.monotonic() > deadline:
                return found
            await asyncio.sleep(1.0)


async def _play(
    gateway: str,
    admin_key: str,
    model: str,
    persona: Persona,
    rng: random.Random,
    episodes: int,
    concurrency: int,
    tally: Tally,
    on_answers: Callable[[list[LiveAnswer]], None],
    continuous: bool,
    pause_s: float,
    tenant: str | None,
    max_tokens: int,
    skills: bool,
) -> None:
    if continuous:
        total = 2 * episodes
        shares = [total // concurrency + (k < total % concurrency) for k in range(concurrency)]

        async def talk(n: int) -> None:
            tally.answers.extend(
                await play_conversation(
                    gateway,
                    admin_key,
                    model,
                    persona,
                    rng,
                    n,
                    pause_s=pause_s,
                    on_answers=on_answers,
                    tenant=tenant,
                    max_tokens=max_tokens,
                    skills=skills,
                )
            )

        await asyncio.gather(*(talk(n) for n in shares if n))
        return
    slots = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with slots:
            answers = await play_episode(
                gateway,
                admin_key,
                model,
                persona,
                rng,
                tenant=tenant,
                max_tokens=max_tokens,
                skills=skills,
            )
        tally.answers += answers
        on_answers(answers)

    await asyncio.gather(*(one() for _ in range(episodes)))
