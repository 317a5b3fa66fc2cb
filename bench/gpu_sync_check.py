"""Weights from the trainer into a serving engine on the same GPU: one trained step as full
weights (`/admin/load_weights`, as the trainer pushes them) and one as a LoRA adapter
(`/v1/load_lora_adapter` with `policy@vN`, the route vLLM has too), each checked by the version
the engine then serves, with the time from checkpoint written to version served.

Run: python bench/gpu_sync_check.py [--shape smollm2-360m] [--tokenizer DIR]
Without a GPU it runs on CPU in float32 (use --shape tiny).
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.engine_bench import wait_healthy  # noqa: E402
from bench.gpu_trainer_check import SHAPES, build_model  # noqa: E402
from bench.trainer_bench import samples  # noqa: E402
from claw_stream.trainer.config import TrainerSettings  # noqa: E402
from claw_stream.trainer.policy import PolicyTrainer  # noqa: E402
from tests.support.processes import free_port  # noqa: E402

ADMIN_KEY = "gpu-sync-check"
PROMPT = [{"role": "user", "content": "Say something."}]


def served_version(base: str, model: str) -> int:
    r = httpx.post(
        f"{base}/v1/chat/completions",
        json={"model": model, "messages": PROMPT, "max_tokens": 4, "temperature": 0},
        timeout=120,
    )
    r.raise_for_status()
    return int(r.json()["weight_version"])


def train_and_save(path: Path, config: TrainerSettings, out: Path, version: int) -> Path:
    trainer = PolicyTrainer(path, config)
    trainer.train_step(samples(4, 256, 49152))
    folder = trainer.save(out, version, {}, [])
    del trainer
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return folder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-360m")
    parser.add_argument(
        "--tokenizer", type=Path, default=REPO / ".cache" / "tests" / "models" / "smollm2-135m"
    )
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    os.environ.setdefault("DS_ACCELERATOR", device)
    tmp = Path(tempfile.mkdtemp(prefix="gpu-sync-check-"))
    path = build_model(args.shape, args.tokenizer, tmp / "model", dtype)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = (tmp / "engine.log").open("wb")
    engine = subprocess.Popen(
        [sys.executable, "-m", "claw_stream", "engine", "--model", str(path), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={
            **os.environ,
            "CLAW_ADMIN_KEY": ADMIN_KEY,
            "CLAW_ENGINE__DEVICE": device,
            "CLAW_ENGINE__DTYPE": "bfloat16" if cuda else "float32",
            "CLAW_ENGINE__SERVED_MODEL_NAME": "policy",
            "CLAW_DATA_DIR": str(tmp / "data"),
        },
    )
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    table = Table(title=f"{args.shape}, trainer and engine on {device} ({dtype})")
    for column in ("update", "checkpoint -> served s", "version served"):
        table.add_column(column)
    try:
        wait_healthy(base, engine, tmp / "engine.log")
        assert served_version(base, "policy") == 0
        common = {"lr": 1e-5, "bf16": cuda, "device": device}
        full = train_and_save(path, TrainerSettings(zero_stage=2, **common), tmp / "full", 1)
        started = time.perf_counter()
        r = httpx.post(
            f"{base}/admin/load_weights",
            json={"path": str(full), "version": 1},
            headers=auth,
            timeout=600,
        )
        r.raise_for_status()
        version = served_version(base, "policy")
        table.add_row("full weights", f"{time.perf_counter() - started:.2f}", str(version))
        lora = TrainerSettings(lora=True, lora_r=16, lora_targets=["q_proj", "v_proj"], **common)
        adapter = train_and_save(path, lora, tmp / "lora", 2)
        started = time.perf_counter()
        r = httpx.post(
            f"{base}/v1/load_lora_adapter",
            json={"lora_name": "policy@v2", "lora_path": str(adapter)},
            headers=auth,
            timeout=600,
        )
        r.raise_for_status()
        version = served_version(base, "policy@v2")
        table.add_row("LoRA adapter", f"{time.perf_counter() - started:.2f}", str(version))
    finally:
        engine.terminate()
        engine.wait(timeout=60)
        log.close()
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
