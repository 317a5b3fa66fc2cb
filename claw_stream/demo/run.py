"""A demo: the persona's episodes (or never-ending conversations), the held-out set scored
beside them."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence

import httpx

from claw_stream.demo.held_out import HeldOut
from claw_stream.demo.persona import Persona, play_conversation, play_episode
from claw_stream.demo.tally import LiveAnswer, Tally
from claw_stream.names import policy_model


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
) -> Tally:
    """`episodes` episodes of two answers each; `continuous`: as many answers in `concurrency`
    never-ending conversations with idle pauses (`play_conversation`). With `held_out`
    questions, the version serving first and every later one the episodes show answer them
    (`HeldOut`, in `Tally.held_out`), or every `held_out_every`-th. With `tenant`, every
    session is the tenant's: its adapter answers once the trainer made one."""
    persona = persona or Persona()
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
            tenant,
            max_tokens,
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
    return tally


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
                )
            )

        await asyncio.gather(*(talk(n) for n in shares if n))
        return
    slots = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with slots:
            answers = await play_episode(
                gateway, admin_key, model, persona, rng, tenant=tenant, max_tokens=max_tokens
            )
        tally.answers += answers
        on_answers(answers)

    await asyncio.gather(*(one() for _ in range(episodes)))
