"""Real OpenClaw traffic on the built-in engine: the three requests of an OpenClaw session
(`tests/fixtures/agents/openclaw/session.jsonl`: turn 1, the request carrying its tool result,
turn 2 with the full history; a ~48 KB system prompt and 12 tools each time) replayed in order,
with the prefix cache on and then off, in one run. Prints per turn the prompt and cached
tokens, time to first token, total time and finish reason, and the turn-1 / later-turns ratio
of time to first token.

Run: python bench/openclaw_bench.py [--model smollm2-135m|NAME|PATH] [--max-tokens 32]
        [--max-model-len N] [--url http://gateway:8000]

SmolLM2-135M's context is 8,192 tokens and these prompts are longer: with it, pass
`--max-model-len 32768` to time the prefill anyway (its answers past 8k are not meaningful).
`--url` sends the turns through a running gateway (`claw-stream up`) instead of starting an
engine; the cache-off run is then skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.engine_bench import wait_healthy  # noqa: E402
from claw_stream.embedded.models import ensure_model  # noqa: E402
from claw_stream.settings import load_settings  # noqa: E402
from tests.support.processes import free_port  # noqa: E402

# recorded OpenClaw bodies (tests/fixtures/agents/openclaw/README.md)
OPENCLAW = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "agents" / "openclaw"
TURNS = (1, 2, 3)  # the `agent --local` session's requests, in order


@dataclass
class Turn:
    index: int
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    total_s: float
    finish: str


def session_bodies() -> list[dict[str, Any]]:
    path = OPENCLAW / "session.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["body"] for r in records if r["index"] in TURNS]


def replay(url: str, body: dict[str, Any], index: int, max_tokens: int) -> Turn:
    body = {**body, "max_completion_tokens": max_tokens, "temperature": 0.0}
    body["stream_options"] = {"include_usage": True}
    started = time.perf_counter()
    first: float | None = None
    usage: dict[str, Any] = {}
    finish = "?"
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=1800) as r:
        if r.status_code != 200:
            r.read()
            raise SystemExit(f"turn {index}: {r.status_code} {r.text[:500]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                if first is None and (choice.get("delta") or {}):
                    first = time.perf_counter()
                finish = choice.get("finish_reason") or finish
            usage = chunk.get("usage") or usage
    total = time.perf_counter() - started
    details = usage.get("prompt_tokens_details") or {}
    return Turn(
        index,
        int(usage.get("prompt_tokens", 0)),
        int(details.get("cached_tokens") or 0),
        (first or time.perf_counter()) - started,
        total,
        finish,
    )


def with_engine(path: Path, cache_mb: float, max_model_len: int | None, run: Any) -> Any:
    port = free_port()
    log_path = Path(tempfile.gettempdir()) / f"openclaw-bench-{port}.log"
    env = {
        **os.environ,
        "CLAW_ADMIN_KEY": "bench",
        "CLAW_ENGINE__PREFIX_CACHE_MB": str(cache_mb),
    }
    if max_model_len:
        env["CLAW_ENGINE__MAX_MODEL_LEN"] = str(max_model_len)
    command = [sys.executable, "-m", "claw_stream", "engine", "--model", str(path)]
    command += ["--port", str(port), "--served-model-name", "policy"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, proc, log_path, timeout_s=600)
            return run(url)
        finally:
            proc.terminate()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--url", default=None, help="a running gateway or engine")
    args = parser.parse_args()
    console = Console()
    bodies = session_bodies()

    def three_turns(url: str) -> list[Turn]:
        turns = []
        for index, body in zip(TURNS, bodies, strict=True):
            with console.status(f"turn {index}…"):
                turns.append(replay(url, body, index, args.max_tokens))
        return turns

    runs: dict[str, list[Turn]] = {}
    if args.url:
        runs["through " + args.url] = three_turns(args.url)
        label = args.url
    else:
        path = ensure_model(args.model, load_settings().models_dir)
        label = path.name
        runs["prefix cache on"] = with_engine(path, 1024, args.max_model_len, three_turns)
        runs["prefix cache off"] = with_engine(path, 0, args.max_model_len, three_turns)

    table = Table(title=f"OpenClaw session replayed: {label}, up to {args.max_tokens} tokens")
    for column in ("run", "turn", "prompt", "cached", "TTFT s", "total s", "finish"):
        table.add_column(column, justify="right")
    for name, turns in runs.items():
        for t in turns:
            table.add_row(
                name,
                str(t.index),
                str(t.prompt_tokens),
                str(t.cached_tokens),
                f"{t.ttft_s:.2f}",
                f"{t.total_s:.2f}",
                t.finish,
            )
    console.print(table)
    for name, turns in runs.items():
        later = sum(t.ttft_s for t in turns[1:]) / len(turns[1:])
        console.print(
            f"{name}: TTFT turn 1 {turns[0].ttft_s:.2f} s, turns 2-3 {later:.2f} s "
            f"({turns[0].ttft_s / later:.1f}x)"
        )


if __name__ == "__main__":
    main()
