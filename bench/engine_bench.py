"""Built-in engine throughput: generated tokens/s at concurrency 1, 4 and 16, against a plain
`model.generate` loop over the same prompts, in one run on this machine.

Run: python bench/engine_bench.py [--model smollm2-135m|PATH] [--max-tokens 64]
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

import httpx
import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from claw_stream.embedded.models import ensure_model  # noqa: E402
from claw_stream.settings import load_settings  # noqa: E402
from tests.support.processes import free_port  # noqa: E402

TOPICS = [
    "the sea",
    "a city at night",
    "bread",
    "rain",
    "a small robot",
    "mountains",
    "a library",
    "winter",
]


def prompts(n: int) -> list[list[dict]]:
    return [
        [{"role": "user", "content": f"Write a short poem about {TOPICS[i % len(TOPICS)]} (#{i})."}]
        for i in range(n)
    ]


def wait_healthy(
    base_url: str, proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float = 180
) -> None:
    """Until the engine answers /health; its log's end when it exits or never answers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(base_url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise SystemExit(f"the engine did not come up:\n{log_path.read_text()[-3000:]}")


async def run_level(
    base_url: str, concurrency: int, n_requests: int, max_tokens: int
) -> tuple[int, float]:
    queue: asyncio.Queue[list[dict]] = asyncio.Queue()
    for p in prompts(n_requests):
        queue.put_nowait(p)
    total = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal total
        while not queue.empty():
            messages = queue.get_nowait()
            r = await client.post(
                "/v1/chat/completions",
                json={
                    "messages": messages,
                    "max_tokens": max_tokens,
                    "temperature": 1.0,
                    "seed": 1,
                },
            )
            r.raise_for_status()
            total += r.json()["usage"]["completion_tokens"]

    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        start = time.perf_counter()
        await asyncio.gather(*[worker(client) for _ in range(concurrency)])
        return total, time.perf_counter() - start


def generate_loop(
    path: Path, n_requests: int, max_tokens: int, device: str, dtype: torch.dtype
) -> tuple[int, float]:
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    total, start = 0, time.perf_counter()
    for messages in prompts(n_requests):
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt"
        )
        ids = (ids if isinstance(ids, torch.Tensor) else ids["input_ids"]).to(device)
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=max_tokens, do_sample=True, temperature=1.0)
        total += out.shape[1] - ids.shape[1]
    return total, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    settings = load_settings()
    path = ensure_model(args.model, settings.models_dir)

    port = free_port()
    log_path = Path(tempfile.gettempdir()) / f"engine-bench-{port}.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "claw_stream", "engine", "--model", str(path), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "CLAW_ADMIN_KEY": "bench"},
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base_url, proc, log_path)
        asyncio.run(run_level(base_url, 2, 2, 8))  # warm-up
        levels = {
            c: asyncio.run(run_level(base_url, c, n, args.max_tokens))
            for c, n in ((1, 8), (4, 16), (16, 32))
        }
    finally:
        proc.terminate()
        proc.wait()
        log.close()
    # the same device and dtype as the engine (settings.engine, CLAW_ENGINE__DEVICE / __DTYPE)
    engine = settings.engine
    baseline = generate_loop(path, 8, args.max_tokens, engine.device, getattr(torch, engine.dtype))

    table = Table(
        title=f"{path.name}, up to {args.max_tokens} tokens per answer, {engine.device} "
        f"{engine.dtype}, CPU threads={torch.get_num_threads()}"
    )
    for column in ("run", "requests", "tokens", "seconds", "tokens/s", "x generate loop"):
        table.add_column(column, justify="right")
    base_rate = baseline[0] / baseline[1]
    table.add_row(
        "model.generate loop",
        "8",
        str(baseline[0]),
        f"{baseline[1]:.1f}",
        f"{base_rate:.1f}",
        "1.00",
    )
    for c, (tokens, seconds) in levels.items():
        rate = tokens / seconds
        n = {1: 8, 4: 16, 16: 32}[c]
        table.add_row(
            f"engine, concurrency {c}",
            str(n),
            str(tokens),
            f"{seconds:.1f}",
            f"{rate:.1f}",
            f"{rate / base_rate:.2f}",
        )
    console = Console(width=120)
    console.print(table)
    c1 = levels[1][0] / levels[1][1]
    c16 = levels[16][0] / levels[16][1]
    console.print(f"concurrency 16 / concurrency 1: {c16 / c1:.2f}x tokens/s")


if __name__ == "__main__":
    main()
