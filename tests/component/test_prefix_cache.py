"""The engine's prefix cache on a real model: a shared prefix is computed once, the tokens
sampled after it carry the logprobs of a full forward pass, and a weight swap never lets a
request use a prefix the older weights computed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from claw_stream.engine.core import (
    EngineCore,
    FinishEvent,
    GenerationParams,
    Request,
    TokenEvent,
)

from ..support.engine import tiny_config

BLOCK = 16


@pytest.fixture(scope="module")
def random_model(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("random-llama")
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    LlamaForCausalLM(tiny_config(len(tokenizer))).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def core(random_model: Path):
    engine = EngineCore(random_model, prefix_cache_mb=64, prefix_block_tokens=BLOCK)
    engine.start()
    yield engine
    engine.stop()


async def generate(
    core: EngineCore, prompt: list[int], max_tokens: int = 6
) -> tuple[list[TokenEvent], FinishEvent]:
    request = Request(
        GenerationParams(prompt_ids=prompt, max_tokens=max_tokens, temperature=0.0),
        asyncio.get_running_loop(),
    )
    core.submit(request)
    tokens: list[TokenEvent] = []
    while not isinstance(event := await request.events.get(), FinishEvent):
        tokens.append(event)
    return tokens, event


def forward_logprobs(model, prompt: list[int], answer: list[int]) -> list[float]:
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([prompt + answer])).logits[0], -1)
    return [float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(answer)]


def assert_exact(model, prompt: list[int], tokens: list[TokenEvent]) -> None:
    expected = forward_logprobs(model, prompt, [t.token_id for t in tokens])
    got = [t.logprob for t in tokens]
    assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < 1e-3


def ids(seed: int, n: int) -> list[int]:
    return torch.randint(100, 40_000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


async def test_a_shared_prefix_is_computed_once_and_its_logprobs_are_exact(
    core: EngineCore, random_model: Path
) -> None:
    model = AutoModelForCausalLM.from_pretrained(random_model, dtype=torch.float32).eval()
    shared = ids(1, 150)  # 9 whole blocks of 16
    _, done = await generate(core, shared + ids(2, 20))
    assert done.cached_tokens == 0
    second_prompt = shared + ids(3, 30)
    second, done = await generate(core, second_prompt)
    assert done.cached_tokens == 144
    assert_exact(model, second_prompt, second)
    # the whole prompt again: all but its last token's block come from the cache
    again, done = await generate(core, second_prompt)
    assert done.cached_tokens == 176
    assert [t.token_id for t in again] == [t.token_id for t in second]
    assert_exact(model, second_prompt, again)
    assert core.prefix_cache is not None
    assert core.prefix_cache.figures.hit_tokens == 144 + 176


async def test_after_a_weight_swap_no_request_uses_the_older_weights_prefix(
    core: EngineCore, random_model: Path
) -> None:
    model = AutoModelForCausalLM.from_pretrained(random_model, dtype=torch.float32).eval()
    shared = ids(4, 100)
    await generate(core, shared + ids(5, 10))
    torch.manual_seed(1)
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}
    await asyncio.wrap_future(core.call(lambda: core.load_weights(new, 1)))
    model.load_state_dict(new)
    prompt = shared + ids(6, 10)
    tokens, done = await generate(core, prompt)
    assert done.cached_tokens == 0
    assert {t.version for t in tokens} == {1}
    assert_exact(model, prompt, tokens)
    prompt = shared + ids(7, 10)
    tokens, done = await generate(core, prompt)
    assert done.cached_tokens == 96  # now from version 1's own computation
    assert_exact(model, prompt, tokens)
