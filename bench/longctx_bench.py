"""A long real prompt on CPU: prefill of an OpenClaw request body rendered with the model's chat
template, greedy decode tokens/s and RSS through the built-in EngineCore, or (--train) alone, two
LoRA or full-weights trainer steps on one sample cut from such a prompt.

Run: python bench/longctx_bench.py [--model gemma3-270m|smollm2-135m|PATH] [--prompt-tokens N]
     [--max-tokens 32] [--threads 2] [--train lora|full [--train-tokens 256]]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

from claw_stream.embedded.models import ensure_model
from claw_stream.engine.chat_format import render_prompt
from claw_stream.engine.core import EngineCore, FinishEvent, GenerationParams, Request
from claw_stream.settings import load_settings

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "agents" / "openclaw"


def bodies() -> list[dict[str, Any]]:
    lines = (FIXTURES / "session.jsonl").read_text().splitlines()
    return [json.loads(line)["body"] for line in lines if line.strip()]


def longest_prompt_under(tokenizer: Any, limit: int) -> list[int]:
    """The rendered body (or leading messages of one) with the most tokens under `limit`; where
    none fits (SmolLM2's 8192 holds not even OpenClaw's system prompt), the first `limit` tokens
    of the shortest."""
    best: list[int] = []
    shortest: list[int] | None = None
    for body in bodies():
        messages = body["messages"]
        for end in range(len(messages), 0, -1):
            ids = render_prompt(tokenizer, messages[:end], body.get("tools"), "auto")
            shortest = ids if shortest is None or len(ids) < len(shortest) else shortest
            if len(ids) <= limit:
                best = max(best, ids, key=len)
                break
    return best or (shortest or [])[:limit]


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


async def generate(core: EngineCore, prompt: list[int], max_tokens: int) -> dict[str, float]:
    request = Request(
        GenerationParams(prompt_ids=prompt, max_tokens=max_tokens, temperature=0.0),
        asyncio.get_running_loop(),
    )
    started, cpu_started = time.perf_counter(), time.process_time()
    core.submit(request)
    stamps: list[float] = []
    cpu: list[float] = []  # process CPU seconds: what a busy shared machine does not distort
    while True:
        event = await request.events.get()
        if isinstance(event, FinishEvent):
            if event.error:
                raise SystemExit(event.error)
            break
        stamps.append(time.perf_counter())
        cpu.append(time.process_time())
    n = len(stamps) - 1
    return {
        "prefill_s": stamps[0] - started,
        "prefill_cpu_s": cpu[0] - cpu_started,
        "decode_tok_s": n / (stamps[-1] - stamps[0]) if n else 0.0,
        "decode_cpu_ms": 1000 * (cpu[-1] - cpu[0]) / n if n else 0.0,
    }


def train_steps(path: Path, prompt: list[int], tokens: int, full: bool, table: Table) -> None:
    from claw_stream.events import Sample
    from claw_stream.ids import uuid7
    from claw_stream.trainer.config import TrainerSettings
    from claw_stream.trainer.policy import PolicyTrainer

    sample = Sample(
        sample_id=uuid7(),
        session_id="bench",
        step_id=uuid7(),
        turn_id=uuid7(),
        method="binary",
        prompt_token_ids=prompt[: tokens - 32],
        response_token_ids=prompt[tokens - 32 : tokens],
        response_logprobs=[-1.0] * 32,
        reward=1.0,
        reward_source="prm",
        weight_version=0,
        released_at_version=0,
    )
    lora = TrainerSettings(lora=True, lora_targets=["q_proj", "v_proj"], micro_batch_tokens=tokens)
    name, config = (
        ("full weights", TrainerSettings(micro_batch_tokens=tokens))
        if full
        else ("LoRA r=8 q,v", lora)
    )
    trainer = PolicyTrainer(path, config)
    times = [trainer.train_step([sample]).step_time_s for _ in range(2)]
    table.add_row(
        f"train step, {name}, 1 x {tokens} tokens", f"{times[0]:.2f} s, then {times[1]:.2f} s"
    )
    table.add_row(
        "peak RSS after training",
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB",
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--prompt-tokens", type=int, default=10_000)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--train", choices=["lora", "full"], help="one trainer step, no serving")
    parser.add_argument("--train-tokens", type=int, default=256)
    args = parser.parse_args()
    path = ensure_model(args.model, load_settings().models_dir)
    if args.train:  # alone in its process, so that its peak RSS is its own
        from transformers import AutoTokenizer

        table = Table("measure", "value", title=f"{args.model}, trainer")
        prompt = longest_prompt_under(AutoTokenizer.from_pretrained(path), args.train_tokens)
        train_steps(path, prompt, args.train_tokens, args.train == "full", table)
        Console().print(table)
        return
    started = time.perf_counter()
    core = EngineCore(path, threads=args.threads)
    load_s = time.perf_counter() - started
    table = Table("measure", "value", title=f"{args.model} on {args.threads} threads")
    table.add_row("load", f"{load_s:.1f} s, RSS {rss_mb():.0f} MB")
    table.add_row("context (max_model_len)", str(core.max_model_len))
    prompt = longest_prompt_under(core.tokenizer, min(args.prompt_tokens, core.max_model_len - 64))
    core.start()
    try:
        await generate(core, prompt[:64], 4)  # warm-up
        for label, ids in (("64", prompt[:64]), (str(len(prompt)), prompt)):
            got = await generate(core, ids, args.max_tokens)
            table.add_row(
                f"{label}-token prompt: prefill",
                f"{got['prefill_s']:.2f} s wall, {got['prefill_cpu_s']:.1f} CPU-s",
            )
            table.add_row(
                f"{label}-token prompt: decode",
                f"{got['decode_tok_s']:.1f} tokens/s wall, {got['decode_cpu_ms']:.0f} CPU-ms/token",
            )
        table.add_row("RSS after the long prompt", f"{rss_mb():.0f} MB")
    finally:
        core.stop()
    Console().print(table)


if __name__ == "__main__":
    asyncio.run(main())
