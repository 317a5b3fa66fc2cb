"""A hundred tenants' adapters trained on one base model in memory and served by one engine.

Each tenant's adapter (rank `--lora-rank` over the trainer's LoRA targets) takes a training
step on samples of its own (`shared_base.AdapterTrainer`, as the trainer trains tenants), is
checkpointed and loaded on a built-in engine as `tenant@v1` (`versions.push`, as the trainer
publishes it), and answers a request by that name. Prints the trainer's and the engine's
resident memory as tenants are added, the memory an added tenant costs each (the slope from the
tenth tenant on), against what one more copy of the base weights would cost; then every adapter
asked at once, rows of up to `--max-batch` adapters in each batch.

Run: python bench/tenants_bench.py [--tenants 100] [--model smollm2-135m] [--lora-rank 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.engine_bench import wait_healthy  # noqa: E402
from claw_stream.embedded.models import ensure_model  # noqa: E402
from claw_stream.events import Sample  # noqa: E402
from claw_stream.settings import load_settings  # noqa: E402
from claw_stream.trainer.config import TrainerSettings  # noqa: E402
from claw_stream.trainer.shared_base import AdapterTrainer, SharedBase  # noqa: E402
from claw_stream.versions.push import push  # noqa: E402
from tests.support.processes import free_port  # noqa: E402
from tests.support.trainer import make_samples  # noqa: E402

ADMIN_KEY = "bench"
QUESTION = [{"role": "user", "content": "Say something about the weather."}]
ANSWERS = [("It is sunny.", 1.0), ("It is raining and cold, and the wind is strong.", -1.0)]


def rss_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def samples_of(tokenizer: Any, tenant: int) -> list[Sample]:
    """The tenant's two judged answers; every other tenant likes the other one."""
    sign = 1.0 if tenant % 2 == 0 else -1.0
    return [
        s.model_copy(update={"tenant": f"t{tenant}", "reward": sign * s.reward})
        for s in make_samples(tokenizer, ANSWERS)
    ]


async def ask(http: httpx.AsyncClient, url: str, model: str) -> int:
    r = await http.post(
        url + "/v1/chat/completions",
        json={"model": model, "messages": QUESTION, "max_tokens": 8, "temperature": 0},
    )
    r.raise_for_status()
    return int(r.json()["weight_version"])


async def run(args: argparse.Namespace, console: Console, path: Path, url: str, pid: int) -> None:
    config = TrainerSettings(
        lora=True, lora_r=args.lora_rank, lora_alpha=2 * args.lora_rank, lr=5e-4
    )
    rows: list[tuple[int, float, float, float]] = []  # tenants, trainer, engine, step seconds
    base = SharedBase(path, config)
    base_mib = sum(p.numel() * p.element_size() for p in base.model.parameters()) / 2**20
    rows.append((0, rss_mib(), rss_mib(pid), 0.0))
    checkpoints = Path(tempfile.mkdtemp(prefix="tenants-bench-"))
    step_seconds = 0.0
    async with httpx.AsyncClient(timeout=600) as http:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("tenants trained and served", total=args.tenants)
            for i in range(args.tenants):
                trainer = AdapterTrainer(base, f"t{i}")
                started = time.perf_counter()
                await asyncio.to_thread(trainer.train_step, samples_of(base.tokenizer, i))
                step_seconds += time.perf_counter() - started
                folder = await asyncio.to_thread(trainer.save, checkpoints / f"t{i}", 1, {}, [])
                await push(http, url, folder, 1, ADMIN_KEY, adapter=f"t{i}@v1")
                if await ask(http, url, f"t{i}@v1") != 1:
                    raise SystemExit(f"t{i}@v1 was not served at version 1")
                if (i + 1) % 10 == 0 or i + 1 == args.tenants:
                    rows.append((i + 1, rss_mib(), rss_mib(pid), step_seconds))
                progress.advance(task)
        started = time.perf_counter()
        versions = await asyncio.gather(*(ask(http, url, f"t{i}@v1") for i in range(args.tenants)))
        all_at_once = time.perf_counter() - started
    adapter_mib = sum(p.numel() * p.element_size() for p in trainer.engine.params) / 2**20
    moments = trainer.engine.optimizer.state.values()
    moments_mib = sum(t.numel() * t.element_size() for m in moments for t in m.values()) / 2**20
    table = Table(
        title=f"{path.name}: tenants' rank-{args.lora_rank} adapters on one base "
        f"({', '.join(config.lora_targets)}), one training step each, each served"
    )
    for column in ("tenants", "trainer RSS MiB", "engine RSS MiB", "training s (sum)"):
        table.add_column(column, justify="right")
    for n, trainer_mib, engine_mib, seconds in rows:
        table.add_row(str(n), f"{trainer_mib:.0f}", f"{engine_mib:.0f}", f"{seconds:.1f}")
    console.print(table)
    first = next(r for r in rows if r[0] >= min(10, args.tenants))
    last = rows[-1]
    span = max(1, last[0] - first[0])
    console.print(
        f"an added tenant holds, in the trainer, its adapter ({adapter_mib:.1f} MiB) and its "
        f"AdamW moments ({moments_mib:.1f} MiB): {adapter_mib + moments_mib:.1f} MiB; resident "
        f"memory grew {(last[1] - first[1]) / span:.1f} MiB a tenant in the trainer (memory a "
        f"step freed is reused) and {(last[2] - first[2]) / span:.1f} MiB in the engine, "
        f"from tenant {first[0]} to {last[0]}; one more copy of the base would be "
        f"{base_mib:.0f} MiB"
    )
    console.print(
        f"{args.tenants} requests, one to each tenant's adapter, at once: {all_at_once:.1f} s, "
        f"all at version {sorted(set(versions))}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--max-batch", type=int, default=32)
    args = parser.parse_args()
    path = ensure_model(args.model, load_settings().models_dir)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = Path(tempfile.gettempdir()) / f"tenants-bench-engine-{port}.log"
    with log_path.open("wb") as log:
        command = ["claw_stream", "engine", "--model", str(path), "--port", str(port)]
        engine = subprocess.Popen(
            [sys.executable, "-m", *command],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "CLAW_ADMIN_KEY": ADMIN_KEY,
                "CLAW_ENGINE__MAX_BATCH": str(args.max_batch),
                "CLAW_ENGINE__MAX_LOADED_ADAPTERS": str(args.tenants),  # every one resident
            },
        )
        try:
            wait_healthy(url, engine, log_path)
            asyncio.run(run(args, Console(width=120), path, url, engine.pid))
        finally:
            engine.terminate()
            engine.wait()


if __name__ == "__main__":
    main()
