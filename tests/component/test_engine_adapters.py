"""Many adapters on one base: past `max_loaded_adapters` the least recently used idle adapter
leaves the model, and a request for it brings it back with the same answers. The engine core
runs in this process on the tiny alpha model; its adapters are trained to say recognisable
words, so the adapter that served is visible in the output."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from claw_stream.engine.chat_format import render_prompt
from claw_stream.engine.core import (
    EngineCore,
    FinishEvent,
    GenerationParams,
    Request,
    TokenEvent,
)

from ..support.engine import MIXED, PROMPT


@pytest.fixture
def core(tiny_models: dict[str, Path]):
    engine = EngineCore(tiny_models["alpha"], max_loaded_adapters=1)
    engine.start()
    yield engine
    engine.stop()


async def say(core: EngineCore, adapter: str | None) -> tuple[str, int]:
    """Greedy answer to PROMPT from `adapter` (None: the base), and the version it reports."""
    prompt = render_prompt(core.tokenizer, PROMPT, None, None)
    request = Request(
        GenerationParams(prompt_ids=prompt, max_tokens=12, temperature=0.0, adapter=adapter),
        asyncio.get_running_loop(),
    )
    core.submit(request)
    text, version = "", -1
    while True:
        event = await request.events.get()
        if isinstance(event, TokenEvent):
            text, version = text + event.text, event.version
        else:
            assert isinstance(event, FinishEvent) and event.error is None, event
            return text.strip(), version


def on_engine(core: EngineCore, fn) -> object:
    return core.call(fn).result(timeout=60)


def test_least_recently_used_adapter_leaves_and_comes_back(
    core: EngineCore, tiny_models: dict[str, Path], mixed_lora: Path
) -> None:
    on_engine(core, lambda: core.load_adapter("alice@v1", str(tiny_models["charlie"])))
    on_engine(core, lambda: core.load_adapter("bob@v2", str(mixed_lora)))
    # both servable, one in the model: alice left when bob came
    assert core.adapters == {"alice@v1": 1, "bob@v2": 2}
    assert list(core.lora.resident) == ["bob@v2"]

    async def rounds() -> list[tuple[str, int]]:
        return [
            await say(core, name) for name in ("alice@v1", "bob@v2", "alice@v1", None, "bob@v2")
        ]

    assert asyncio.run(rounds()) == [
        ("charlie charlie charlie", 1),
        (MIXED, 2),
        ("charlie charlie charlie", 1),  # reloaded from its folder: the same answer
        ("alpha alpha alpha", 0),  # the base model under them is untouched
        (MIXED, 2),
    ]
    f = core.lora.figures
    assert (f.loads, f.reloads, f.evictions) == (6, 4, 5)
    assert len(core.lora.resident) == 1

    # two adapters asked for at once: the budget is passed while both run, not refused
    async def together() -> list[tuple[str, int]]:
        return list(await asyncio.gather(say(core, "alice@v1"), say(core, "bob@v2")))

    assert asyncio.run(together()) == [("charlie charlie charlie", 1), (MIXED, 2)]
    assert asyncio.run(say(core, None)) == ("alpha alpha alpha", 0)

    # unloading takes it off the registry: a request for it is refused, not reloaded
    on_engine(core, lambda: core.unload_adapter("alice@v1"))
    assert "alice@v1" not in core.adapters and "alice@v1" not in core.lora.resident

    async def gone() -> FinishEvent:
        prompt = render_prompt(core.tokenizer, PROMPT, None, None)
        request = Request(
            GenerationParams(prompt_ids=prompt, max_tokens=4, adapter="alice@v1"),
            asyncio.get_running_loop(),
        )
        core.submit(request)
        event = await request.events.get()
        assert isinstance(event, FinishEvent)
        return event

    assert asyncio.run(gone()).error == "adapter alice@v1 is not loaded"
    assert asyncio.run(say(core, "bob@v2")) == (MIXED, 2)


async def answer(core: EngineCore, adapter: str | None) -> tuple[list[int], list[float], int]:
    """Greedy answer to PROMPT: its token ids, their logprobs and the version reported."""
    prompt = render_prompt(core.tokenizer, PROMPT, None, None)
    request = Request(
        GenerationParams(prompt_ids=prompt, max_tokens=12, temperature=0.0, adapter=adapter),
        asyncio.get_running_loop(),
    )
    core.submit(request)
    ids: list[int] = []
    logprobs: list[float] = []
    version = -1
    while True:
        event = await request.events.get()
        if isinstance(event, FinishEvent):
            assert event.error is None, event
            return ids, logprobs, version
        ids.append(event.token_id)
        logprobs.append(event.logprob)
        version = event.version


def peft_logprobs(base: Path, adapter: Path, core: EngineCore, ids: list[int]) -> list[float]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter).eval()
    prompt = render_prompt(core.tokenizer, PROMPT, None, None)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    chosen = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ids)[:, None])
    return chosen[:, 0].tolist()


def test_rows_of_different_adapters_decode_in_one_batch_as_each_alone(
    tiny_models: dict[str, Path], mixed_lora: Path
) -> None:
    core = EngineCore(tiny_models["alpha"])
    core.start()
    try:
        on_engine(core, lambda: core.load_adapter("alice@v1", str(tiny_models["charlie"])))
        on_engine(core, lambda: core.load_adapter("bob@v2", str(mixed_lora)))
        names: list[str | None] = ["alice@v1", None, "bob@v2", "alice@v1"]

        async def alone() -> list[tuple[list[int], list[float], int]]:
            return [await answer(core, name) for name in names]

        async def together() -> list[tuple[list[int], list[float], int]]:
            return list(await asyncio.gather(*(answer(core, name) for name in names)))

        steps = core.steps
        one_by_one = asyncio.run(alone())
        steps_alone = core.steps - steps
        steps = core.steps
        batched = asyncio.run(together())
        steps_together = core.steps - steps
    finally:
        core.stop()
    words = [core.tokenizer.decode(ids, skip_special_tokens=True).strip() for ids, _, _ in batched]
    assert words == [
        "charlie charlie charlie",
        "alpha alpha alpha",
        MIXED,
        "charlie charlie charlie",
    ]
    assert [v for _, _, v in batched] == [1, 0, 2, 1]
    for (ids, logprobs, _), (ids_alone, logprobs_alone, _) in zip(batched, one_by_one, strict=True):
        assert ids == ids_alone
        assert logprobs == pytest.approx(logprobs_alone, abs=1e-4)
    # as peft computes the adapter's model: the same logprobs, teacher-forced
    assert batched[2][1] == pytest.approx(
        peft_logprobs(tiny_models["alpha"], mixed_lora, core, batched[2][0]), abs=1e-4
    )
    # one forward a step for the four rows (a step or two more where one joined late), where
    # a batch per adapter took a forward each: as many steps as the three answers' together
    longest = max(len(ids) for ids, _, _ in batched)
    assert steps_together <= longest + 1 < steps_alone, (steps_together, steps_alone)
