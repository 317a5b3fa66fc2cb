"""Helpers for engine tests: tiny models trained to say something, and a real engine process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from claw_stream.engine.chat_format import render_prompt

from .processes import free_port
from .service_logs import watch

ADMIN_KEY = "test-admin-key"


def tiny_config(vocab_size: int, context: int = 512) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )


def train_to_say(
    model: torch.nn.Module,
    tokenizer: Any,
    examples: list[tuple[list[dict], str]],
    *,
    tools: Any = None,
    steps: int = 300,
    lr: float = 3e-3,
) -> float:
    """Overfit `model` so that greedy decoding of each chat prompt yields its answer then EOS.

    Logits are computed only where they predict the answer: over the whole prompt, the tiny
    model's 49k-word head was three quarters of a step (429 against 99 ms a step for the tasks
    test's model, the same loss)."""
    batches = []
    for messages, answer in examples:
        prompt = render_prompt(tokenizer, messages, tools, None)
        target = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        batches.append((torch.tensor([prompt + target]), torch.tensor(target)))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=lr)
    model.train()
    for _ in range(steps):
        loss = (
            sum(
                F.cross_entropy(  # the last len(target) + 1 positions predict the target's tokens
                    model(input_ids=ids, logits_to_keep=len(target) + 1).logits[0, :-1].float(),
                    target,
                )
                for ids, target in batches
            )
            / len(batches)
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.01:
            break
    model.eval()
    return loss.item()


def make_tiny_model(
    folder: Path,
    tokenizer_dir: Path,
    examples: list[tuple[list[dict], str]],
    *,
    tools: Any = None,
    seed: int = 0,
    context: int = 512,
) -> Path:
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    model = LlamaForCausalLM(tiny_config(len(tokenizer), context))
    loss = train_to_say(model, tokenizer, examples, tools=tools)
    assert loss < 0.05, f"tiny model did not learn its answers (loss {loss:.3f})"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


PROMPT = [{"role": "user", "content": "Say your word."}]
OTHER_PROMPT = [{"role": "user", "content": "Say the other word."}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TOOL_PROMPT = [{"role": "user", "content": "What's the weather in Paris?"}]
TOOL_ANSWER = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


# the tiny models' folders under the one build_tiny_models fills
TINY_MODELS = {"alpha": "alpha", "bravo": "bravo", "tools": "tools", "charlie": "charlie-lora"}


def build_tiny_models(base: Path, tokenizer_dir: Path) -> dict[str, Path]:
    """alpha, bravo (full models), tools (answers with a tool call) and a charlie LoRA on alpha."""
    # alpha also knows "charlie" (for another prompt), so a small adapter can make it say it
    alpha = make_tiny_model(
        base / "alpha",
        tokenizer_dir,
        [(PROMPT, "alpha alpha alpha"), (OTHER_PROMPT, "charlie charlie charlie")],
    )
    bravo = make_tiny_model(base / "bravo", tokenizer_dir, [(PROMPT, "bravo bravo bravo")], seed=1)
    tools = make_tiny_model(
        base / "tools", tokenizer_dir, [(TOOL_PROMPT, TOOL_ANSWER)], tools=[WEATHER_TOOL]
    )
    # a LoRA adapter on top of alpha that makes it say charlie
    charlie = train_lora(alpha, base / "charlie-lora", "charlie charlie charlie", seed=2)
    return {"alpha": alpha, "bravo": bravo, "tools": tools, "charlie": charlie}


def train_lora(alpha: Path, folder: Path, answer: str, seed: int) -> Path:
    """A LoRA adapter on alpha that makes it answer PROMPT with `answer` (words alpha knows:
    a word it never learnt is beyond a small adapter, its loss stayed at 8)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(alpha)
    tokenizer = AutoTokenizer.from_pretrained(alpha)
    lora = get_peft_model(
        model,
        LoraConfig(
            r=8,
            lora_alpha=16,
            target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"],
        ),
    )
    loss = train_to_say(lora, tokenizer, [(PROMPT, answer)], steps=400)
    assert loss < 0.05, loss
    lora.save_pretrained(folder)
    return folder


MIXED = "charlie alpha charlie"


def build_mixed_lora(folder: Path, alpha: Path) -> Path:
    """A LoRA adapter on alpha that makes it say MIXED (charlie-lora makes it say charlie)."""
    return train_lora(alpha, folder, MIXED, seed=3)


SEA = "Reply with one short sentence about the sea."  # what the coding agents were asked
SEA_ANSWER = "The sea is calm."


def build_long_model(folder: Path, tokenizer_dir: Path) -> Path:
    """A tiny model of 32k context that answers the sea question briefly and stops, even
    after the 9-12k-token prompts of Claude Code and Codex (their prefill takes ~2 s here)."""
    return make_tiny_model(
        folder,
        tokenizer_dir,
        [
            ([{"role": "user", "content": SEA}], SEA_ANSWER),
            ([{"role": "system", "content": "You are an agent."}, *PROMPT], SEA_ANSWER),
        ],
        context=32768,
    )


class EngineProcess:
    """`claw-stream engine` in a subprocess on a free port."""

    def __init__(
        self,
        model: Path | str,
        data_dir: Path,
        *extra: str,
        env: dict[str, str] | None = None,
        port: int | None = None,  # an engine restarted where clients know it
    ):
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = watch("engine", data_dir / f"engine-{self.port}.log").open("wb")
        env = {
            **os.environ,
            "CLAW_DATA_DIR": str(data_dir),
            "CLAW_ADMIN_KEY": ADMIN_KEY,
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "claw_stream",
                "engine",
                "--model",
                str(model),
                "--port",
                str(self.port),
                *extra,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine exited: {Path(self.log.name).read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError("engine did not become healthy")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self.log.close()
