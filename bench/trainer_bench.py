"""Trainer step time against a raw forward + backward + optimizer step of the same tokens on the
same model, and the time from a checkpoint written to the new version being served.

Run: python bench/trainer_bench.py [--model smollm2-135m|PATH] [--samples 4] [--tokens 256] [--steps 3]

With --sessions: conversations shaped like OpenClaw's (a long shared system prompt, then T
turns whose prompts extend one another), T = 2, 4, 8: step time and tokens processed per
trained answer token, packed (one sequence per conversation) vs one sequence per turn.
Run: python bench/trainer_bench.py --sessions [--system-tokens 1024] [--turns 2,4,8]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoModelForCausalLM

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.engine_bench import wait_healthy  # noqa: E402
from claw_stream.embedded.models import ensure_model  # noqa: E402
from claw_stream.events import Sample  # noqa: E402
from claw_stream.ids import uuid7  # noqa: E402
from claw_stream.settings import load_settings  # noqa: E402
from claw_stream.trainer.config import TrainerSettings  # noqa: E402
from claw_stream.trainer.policy import PolicyTrainer, StepMetrics  # noqa: E402
from tests.support.processes import free_port  # noqa: E402


def samples(n: int, tokens: int, vocab: int) -> list[Sample]:
    g = torch.Generator().manual_seed(0)
    half = tokens // 2
    out = []
    for i in range(n):
        ids = torch.randint(10, vocab, (tokens,), generator=g).tolist()
        out.append(
            Sample(
                sample_id=uuid7(),
                session_id=f"bench-{i}",
                step_id=uuid7(),
                turn_id=uuid7(),
                method="binary",
                prompt_token_ids=ids[:half],
                response_token_ids=ids[half:],
                response_logprobs=[-2.0] * (tokens - half),
                reward=1.0 if i % 2 else -1.0,
                reward_source="prm",
                weight_version=0,
                released_at_version=0,
            )
        )
    return out


def conversation(turns: int, system: int, vocab: int, seed: int) -> list[Sample]:
    """One session: a shared system prompt, then turns of a 48-token answer and a 32-token
    next message (tool result or user), each prompt extending the one before."""
    g = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(10, vocab, (n,), generator=g).tolist()

    prompt, out = ids(system), []
    for k in range(turns):
        response = ids(48)
        out.append(
            Sample(
                sample_id=uuid7(),
                session_id=f"conv-{seed}",
                step_id=uuid7(),
                turn_id=uuid7(),
                method="binary",
                prompt_token_ids=prompt,
                response_token_ids=response,
                response_logprobs=[-2.0] * len(response),
                reward=1.0 if k % 2 else -1.0,
                reward_source="prm",
                weight_version=0,
                released_at_version=0,
            )
        )
        prompt = prompt + response + ids(32)
    return out


def sessions_bench(path: Path, turn_counts: list[int], system: int, console: Console) -> None:
    table = Table(
        title=f"{path.name}: one conversation per step, {system}-token system prompt, "
        f"48-token answers, fp32, CPU threads={torch.get_num_threads()}"
    )
    for column in ("turns", "mode", "step s", "tokens processed", "per trained token", "speed-up"):
        table.add_column(column, justify="right")
    # one trainer at a time, with a modest micro-batch budget: a forward and backward pass
    # keeps ~2 MB of activations per token on SmolLM2-135M in fp32
    results: dict[tuple[int, bool], StepMetrics] = {}
    for packed in (True, False):
        trainer = PolicyTrainer(
            path, TrainerSettings(lr=1e-6, micro_batch_tokens=2048, pack=packed)
        )
        vocab = trainer.engine.module.config.vocab_size
        for turns in turn_counts:
            batch = conversation(turns, system, vocab, seed=turns)
            trainer.train_step(batch)  # warm-up
            results[(turns, packed)] = trainer.train_step(batch)
        del trainer
        gc.collect()
    for turns in turn_counts:
        figures = {packed: results[(turns, packed)] for packed in (True, False)}
        for packed in (False, True):
            m = figures[packed]
            speed = figures[False].step_time_s / m.step_time_s
            table.add_row(
                str(turns),
                "packed" if packed else "per turn",
                f"{m.step_time_s:.2f}",
                str(m.n_tokens),
                f"{m.tokens_per_trained:.1f}",
                f"{speed:.1f}x",
            )
    console.print(table)


def raw_steps(
    path: Path,
    batch: list[Sample],
    steps: int,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> list[float]:
    """The same tokens through a plain torch loop: forward, token log-probs, backward, AdamW."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids = torch.tensor([s.prompt_token_ids + s.response_token_ids for s in batch], device=device)
    rewards = torch.tensor([s.reward for s in batch], device=device)
    n_prompt = len(batch[0].prompt_token_ids)
    times = []
    for _ in range(steps + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        logits = model(input_ids=ids).logits[:, n_prompt - 1 : -1]
        logprobs = (
            torch.log_softmax(logits.float(), -1).gather(2, ids[:, n_prompt:, None]).squeeze(-1)
        )
        loss = -(logprobs.mean(1) * rewards).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times[1:]  # the first step warms up


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--sessions", action="store_true", help="packed vs per-turn sessions")
    parser.add_argument("--system-tokens", type=int, default=1024)
    parser.add_argument("--turns", default="2,4,8")
    args = parser.parse_args()
    settings = load_settings()
    path = ensure_model(args.model, settings.models_dir)
    console = Console(width=120)
    if args.sessions:
        turns = [int(t) for t in args.turns.split(",")]
        sessions_bench(path, turns, args.system_tokens, console)
        return

    trainer = PolicyTrainer(
        path, TrainerSettings(lr=1e-6, micro_batch_tokens=args.samples * args.tokens)
    )
    batch = samples(args.samples, args.tokens, trainer.engine.module.config.vocab_size)
    trainer_times = [trainer.train_step(batch).step_time_s for _ in range(args.steps + 1)][1:]
    raw_times = raw_steps(path, batch, args.steps)

    # checkpoint written -> version served, through a real built-in engine
    tmp = Path(tempfile.mkdtemp(prefix="trainer-bench-"))
    port = free_port()
    engine = subprocess.Popen(
        [sys.executable, "-m", "claw_stream", "engine", "--model", str(path), "--port", str(port)],
        stdout=(tmp / "engine.log").open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "CLAW_ADMIN_KEY": "bench", "CLAW_DATA_DIR": str(tmp)},
    )
    publish_times, save_times = [], []
    try:
        wait_healthy(f"http://127.0.0.1:{port}", engine, tmp / "engine.log")
        for version in range(1, 4):
            start = time.perf_counter()
            folder = trainer.save(tmp / "ckpt", version, {}, [])
            saved = time.perf_counter()
            r = httpx.post(
                f"http://127.0.0.1:{port}/admin/load_weights",
                json={"path": str(folder), "version": version},
                headers={"Authorization": "Bearer bench"},
                timeout=120,
            )
            r.raise_for_status()
            served = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0][
                "weight_version"
            ]
            assert served == version
            save_times.append(saved - start)
            publish_times.append(time.perf_counter() - saved)
    finally:
        engine.terminate()
        engine.wait()

    tokens = args.samples * args.tokens
    table = Table(
        title=f"{path.name}: {args.samples} samples x {args.tokens} tokens, fp32, CPU threads={torch.get_num_threads()}"
    )
    for column in ("what", "median s", "tokens/s"):
        table.add_column(column, justify="right")
    t_med, r_med = statistics.median(trainer_times), statistics.median(raw_times)
    table.add_row(
        "claw-stream trainer step (DeepSpeed ZeRO-1)", f"{t_med:.2f}", f"{tokens / t_med:.0f}"
    )
    table.add_row("raw forward + backward + AdamW", f"{r_med:.2f}", f"{tokens / r_med:.0f}")
    table.add_row("checkpoint save (safetensors)", f"{statistics.median(save_times):.2f}", "")
    table.add_row(
        "checkpoint written -> served by the engine", f"{statistics.median(publish_times):.2f}", ""
    )
    console.print(table)
    console.print(f"trainer step / raw step: {t_med / r_med:.2f}x (target <= 1.2)")


if __name__ == "__main__":
    main()
