"""The trainer on a GPU: `PolicyTrainer` (DeepSpeed with NCCL, bf16, ZeRO 1/2/3) against a plain
bf16 torch loop of the same tokens, on a model built from a config (no weights to fetch), the
time to write a checkpoint the engines load, and whether that checkpoint holds the trained
weights (ZeRO-3 partitions them: a checkpoint written from the module as it stands would hold
empty tensors).

Run: python bench/gpu_trainer_check.py [--shape smollm2-360m] [--samples 8] [--tokens 1024]
     [--steps 5] [--zero 1,2,3] [--tokenizer DIR]
Without a GPU it runs on CPU in float32 (gloo), as a check that it works: use --shape tiny.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.trainer_bench import raw_steps, samples  # noqa: E402
from claw_stream.trainer.config import TrainerSettings  # noqa: E402
from claw_stream.trainer.policy import PolicyTrainer  # noqa: E402

# Llama-shaped configs of SmolLM2's sizes (hidden, layers, heads, kv heads, intermediate)
SHAPES = {
    "tiny": (64, 2, 4, 2, 128),
    "smollm2-135m": (576, 30, 9, 3, 1536),
    "smollm2-360m": (960, 32, 15, 5, 2560),
    "smollm2-1.7b": (2048, 24, 32, 32, 8192),
}


def build_model(shape: str, tokenizer_dir: Path, out: Path, dtype: torch.dtype) -> Path:
    hidden, layers, heads, kv, inter = SHAPES[shape]
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=inter,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def trained_weights_saved(trainer: PolicyTrainer, folder: Path) -> tuple[bool, str]:
    """Whether checkpoint `folder` holds the trainer's weights as they are now."""
    saved: dict[str, torch.Tensor] = {}
    for file in folder.glob("*.safetensors"):
        saved.update(load_file(str(file)))
    module = trainer.engine.module
    params = dict(module.named_parameters())
    gathered: dict[str, torch.Tensor] = {}
    if trainer.config.zero_stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(params.values())):
            gathered = {k: v.detach().float().cpu().clone() for k, v in params.items()}
    else:
        gathered = {k: v.detach().float().cpu() for k, v in params.items()}
    empty = [k for k, v in saved.items() if v.numel() == 0]
    if empty:
        return False, f"{len(empty)} empty tensors (e.g. {empty[0]})"
    worst = 0.0
    for name, value in gathered.items():
        if name not in saved:
            continue  # a tied weight saved once
        worst = max(worst, (saved[name].float() - value).abs().max().item())
    return worst < 1e-2, f"max |saved - trained| {worst:.2e}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-360m")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--zero", default="1,2,3")
    parser.add_argument(
        "--tokenizer", type=Path, default=REPO / ".cache" / "tests" / "models" / "smollm2-135m"
    )
    args = parser.parse_args()
    console = Console(width=120)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    os.environ.setdefault("DS_ACCELERATOR", device)
    tmp = Path(tempfile.mkdtemp(prefix="gpu-trainer-check-"))
    path = build_model(args.shape, args.tokenizer, tmp / "model", dtype)
    n_params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(path).parameters())
    title = (
        f"{args.shape} ({n_params / 1e6:.0f}M parameters, random), {args.samples} x "
        f"{args.tokens} tokens, {torch.cuda.get_device_name() if cuda else 'CPU'}, {dtype}"
    )
    table = Table(title=title)
    for column in ["run", "step s (median)", "tokens/s", "peak GiB", "checkpoint s", "saved"]:
        table.add_column(column)
    tokens = args.samples * args.tokens
    batch = samples(args.samples, args.tokens, 49152)
    for stage in [int(z) for z in args.zero.split(",")]:
        config = TrainerSettings(
            lr=1e-5, micro_batch_tokens=tokens, zero_stage=stage, bf16=cuda, device=device
        )
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        trainer = PolicyTrainer(path, config)
        times = [trainer.train_step(batch).step_time_s for _ in range(args.steps + 1)][1:]
        started = time.perf_counter()
        folder = trainer.save(tmp / f"ckpt-zero{stage}", 1, {}, [])
        save_s = time.perf_counter() - started
        ok, detail = trained_weights_saved(trainer, folder)
        step = statistics.median(times)
        peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
        table.add_row(
            f"PolicyTrainer ZeRO-{stage}",
            f"{step:.3f}",
            f"{tokens / step:,.0f}",
            f"{peak:.1f}",
            f"{save_s:.2f}",
            ("yes " if ok else "NO ") + detail,
        )
        del trainer
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    raw = raw_steps(path, batch, args.steps, device=device, dtype=dtype)
    step = statistics.median(raw)
    table.add_row("plain torch loop", f"{step:.3f}", f"{tokens / step:,.0f}", "", "", "")
    console.print(table)


if __name__ == "__main__":
    main()
