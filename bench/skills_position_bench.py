"""Where a skill works: the demo's 24 held-out questions asked of the built-in engine with one
skill ("Answer in under 30 words.") nowhere, at the end of a system prompt, and after the first
user message's text (`skills.position`), each question with its own seed, 64 tokens at most;
the persona's rule counts the answers under 30 words. Asked plainly and with the brief framing
("In one or two sentences: ", `claw-stream demo --brief`).

A small model follows a lesson said in the user's turn and overlooks one in the system prompt:
this is why `first_user` is the default (claw_stream/skills/text.py).

Run: python bench/skills_position_bench.py [--model smollm2-135m|PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from claw_stream.demo.held_out import HELD_OUT_QUESTIONS  # noqa: E402
from claw_stream.demo.persona import ASK_BRIEFLY, Persona  # noqa: E402
from claw_stream.embedded.models import ensure_model  # noqa: E402
from claw_stream.settings import load_settings  # noqa: E402
from claw_stream.skills.text import Chosen, render, with_block  # noqa: E402
from tests.support.engine import ADMIN_KEY, EngineProcess  # noqa: E402

SKILL = "Answer in under 30 words."
POSITIONS = {"none": None, "system": "system", "first_user": "first_user"}


async def liked(base_url: str, persona: Persona, position: str | None) -> tuple[int, float]:
    """How many of the 24 answers the persona likes, and their mean length in words."""
    block = render([Chosen("1", SKILL)])

    async def ask(client: httpx.AsyncClient, i: int, question: str) -> str:
        messages = [{"role": "user", "content": persona.ask(question)}]
        if position is not None:
            messages = with_block(messages, block, position)
        r = await client.post(
            "/v1/chat/completions",
            json={
                "model": "policy",
                "messages": messages,
                "max_tokens": 64,
                "temperature": 1.0,
                "seed": i,
            },
        )
        r.raise_for_status()
        return str(r.json()["choices"][0]["message"]["content"] or "")

    async with httpx.AsyncClient(
        base_url=base_url, timeout=600, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    ) as client:
        texts = await asyncio.gather(*(ask(client, i, q) for i, q in enumerate(HELD_OUT_QUESTIONS)))
    return sum(persona.likes(t) for t in texts), sum(len(t.split()) for t in texts) / len(texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args()
    console = Console()
    model = ensure_model(args.model, load_settings().models_dir)
    table = Table(title=f"{model.name}: answers under 30 words of 24, with the skill {SKILL!r}")
    for column in ("asked", "skill", "liked", "mean words"):
        table.add_column(column, justify="right")
    with tempfile.TemporaryDirectory() as tmp:
        engine = EngineProcess(model, Path(tmp), "--served-model-name", "policy")
        try:
            with console.status("asking") as status:
                for framing, name in (("", "plainly"), (ASK_BRIEFLY, "briefly")):
                    persona = Persona(30, "short", framing)
                    for label, position in POSITIONS.items():
                        status.update(f"{name}, skill: {label}")
                        n, words = asyncio.run(liked(engine.base_url, persona, position))
                        table.add_row(name, label, f"{n}/24", f"{words:.0f}")
        finally:
            engine.stop()
    console.print(table)


if __name__ == "__main__":
    main()
