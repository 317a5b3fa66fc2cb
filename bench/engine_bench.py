"""Built-in engine throughput: generated tokens/s at concurrency 1, 4 and 16, against a plain
`model.generate` loop over the same prompts, in one run on this machine.

`--adapters K`: K LoRA adapters on the model (personal adapters, one per tenant); 16 clients, and
`--max-batch` clients, whose requests go to 1, 4, 16 or 64 of them at once (up to K), against
the base model: rows of different adapters decode in one batch; and the time a request waits
while an adapter evicted past `engine.max_loaded_adapters` loads again.

Run: python bench/engine_bench.py [--model smollm2-135m|PATH] [--max-tokens 64] [--adapters K]
     [--max-batch 64]
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
    base_url: str,
    concurrency: int,
    n_requests: int,
    max_tokens: int,
    models: list[str] | None = None,
) -> tuple[int, float]:
    """Tokens generated and seconds taken; request i names `models[i % len(models)]`."""
    queue: asyncio.Queue[tuple[int, list[dict]]] = asyncio.Queue()
    for i, p in enumerate(prompts(n_requests)):
        queue.put_nowait((i, p))
    total = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal total
        while not queue.empty():
            i, messages = queue.get_nowait()
            model = {"model": models[i % len(models)]} if models else {}
            r = await client.post(
                "/v1/chat/completions",
                json={
                    "messages": messages,
                    "max_tokens": max_tokens,
                    "temperature": 1.0,
                    "seed": 1,
                    **model,
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


def make_adapters(path: Path, folder: Path, k: int, rank: int) -> list[Path]:
    """K LoRA adapters on the model, random (LoRA's usual start is a no-op: B = 0), each
    folder as the trainer writes one."""
    from peft import LoraConfig, get_peft_model

    base = AutoModelForCausalLM.from_pretrained(path)
    lora = get_peft_model(
        base,
        LoraConfig(
            r=rank,
            lora_alpha=2 * rank,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            init_lora_weights=False,
        ),
    )
    out = []
    for i in range(k):
        torch.manual_seed(i)
        with torch.no_grad():
            for name, param in lora.named_parameters():
                if "lora_" in name:
                    param.normal_(0, 0.01)
        lora.save_pretrained(folder / f"tenant{i}")
        out.append(folder / f"tenant{i}")
    return out


def adapter_figures(base_url: str) -> dict[str, float]:
    """The engine's adapter counters from /metrics."""
    text = httpx.get(base_url + "/metrics").text
    figures = {}
    for line in text.splitlines():
        if line.startswith("claw_engine_adapter") and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            figures[name] = float(value)
    return figures


def bench_adapters(base_url: str, path: Path, args: argparse.Namespace, console: Console) -> None:
    k = args.adapters
    headers = {"Authorization": "Bearer bench"}
    with tempfile.TemporaryDirectory(prefix="engine-bench-adapters-") as tmp:
        folders = make_adapters(path, Path(tmp), k + 1, args.lora_rank)
        started = time.perf_counter()
        for i, folder in enumerate(folders[:k]):
            r = httpx.post(
                base_url + "/v1/load_lora_adapter",
                json={"lora_name": f"tenant{i}@v1", "lora_path": str(folder)},
                headers=headers,
                timeout=120,
            )
            r.raise_for_status()
        first_load = (time.perf_counter() - started) / k
        names = [f"tenant{i}@v1" for i in range(k)]
        # (clients, adapters their requests go to): each batch holds rows of that many adapters;
        # the levels run forwards then backwards, summed, so a slower minute of a shared machine
        # does not fall on one level alone
        plan = [
            (clients, in_use)
            for clients in sorted({min(16, args.max_batch), args.max_batch})
            for in_use in [0, *sorted({min(n, k, clients) for n in (1, 4, 16, 64)})]
        ]
        levels: dict[tuple[int, str], tuple[int, float]] = {}
        for clients, in_use in [*plan, *reversed(plan)]:
            label = f"{in_use} adapter(s)" if in_use else "base model"
            tokens, seconds = asyncio.run(
                run_level(base_url, clients, 2 * clients, args.max_tokens, names[:in_use] or None)
            )
            before = levels.get((clients, label), (0, 0.0))
            levels[(clients, label)] = (before[0] + tokens, before[1] + seconds)

        # one more adapter than the budget: the least recently used one leaves the model
        def one(model: str) -> float:
            started = time.perf_counter()
            asyncio.run(run_level(base_url, 1, 1, 8, [model]))
            return time.perf_counter() - started

        resident = min(one(names[-1]) for _ in range(3))
        httpx.post(
            base_url + "/v1/load_lora_adapter",
            json={"lora_name": f"tenant{k}@v1", "lora_path": str(folders[k])},
            headers=headers,
            timeout=120,
        ).raise_for_status()
        before = adapter_figures(base_url)
        evicted = [one(names[0])]
        after = adapter_figures(base_url)
    reloads = after.get('claw_engine_adapter_loads_total{kind="reload"}', 0) - before.get(
        'claw_engine_adapter_loads_total{kind="reload"}', 0
    )
    load_s = after.get("claw_engine_adapter_load_seconds_total", 0) - before.get(
        "claw_engine_adapter_load_seconds_total", 0
    )

    table = Table(
        title=f"{path.name} + {k} LoRA adapters (rank {args.lora_rank}), "
        f"{args.max_tokens} tokens per answer, 4 requests per client (2 each way)"
    )
    for column in ("clients", "requests to", "tokens", "seconds", "tokens/s", "x one adapter"):
        table.add_column(column, justify="right")
    for (clients, label), (tokens, seconds) in levels.items():
        one = levels[(clients, "1 adapter(s)")]
        rate = tokens / seconds
        table.add_row(
            str(clients),
            label,
            str(tokens),
            f"{seconds:.1f}",
            f"{rate:.1f}",
            f"{rate / (one[0] / one[1]):.2f}",
        )
    console.print(table)
    console.print(
        f"adapter load at registration: {first_load * 1000:.0f} ms each; an 8-token request "
        f"to a resident adapter {resident * 1000:.0f} ms, to an evicted one "
        f"{evicted[0] * 1000:.0f} ms ({reloads:.0f} reload, {load_s * 1000:.0f} ms of loading)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--adapters", type=int, default=0, help="K LoRA adapters in concurrent use (0: none)"
    )
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument(
        "--max-batch", type=int, default=16, help="The engine's batch, and the most clients"
    )
    args = parser.parse_args()
    settings = load_settings()
    path = ensure_model(args.model, settings.models_dir)
    console = Console(width=120)

    port = free_port()
    log_path = Path(tempfile.gettempdir()) / f"engine-bench-{port}.log"
    log = log_path.open("wb")
    budget = {"CLAW_ENGINE__MAX_LOADED_ADAPTERS": str(args.adapters)} if args.adapters else {}
    budget["CLAW_ENGINE__MAX_BATCH"] = str(max(16, args.max_batch))
    proc = subprocess.Popen(
        [sys.executable, "-m", "claw_stream", "engine", "--model", str(path), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "CLAW_ADMIN_KEY": "bench", **budget},
    )
    base_url = f"http://127.0.0.1:{port}"
    if args.adapters:
        try:
            wait_healthy(base_url, proc, log_path)
            asyncio.run(run_level(base_url, 2, 2, 8))  # warm-up
            bench_adapters(base_url, path, args, console)
        finally:
            proc.terminate()
            proc.wait()
            log.close()
        return
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
    console.print(table)
    c1 = levels[1][0] / levels[1][1]
    c16 = levels[16][0] / levels[16][1]
    console.print(f"concurrency 16 / concurrency 1: {c16 / c1:.2f}x tokens/s")


if __name__ == "__main__":
    main()
