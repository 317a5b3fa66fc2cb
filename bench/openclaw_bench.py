"""Real OpenClaw traffic on the built-in engine: the first three requests of an OpenClaw
session replayed in order, for both of OpenClaw's profiles, with the prefix cache on and then
off, in one run:

- `full`: its default profile (`tests/fixtures/agents/openclaw/session.jsonl`: turn 1, the
  request carrying its tool result, turn 2; a ~48 KB system prompt and 12 tools each time,
  12.7-15k tokens);
- `small`: its small-model profile, what `claw-stream connect openclaw` writes for a model of
  less than 32k context (`small-profile-session.jsonl`: three turns, 7.5k characters of system
  prompt, 3 tools, ~2.7k tokens), each request carrying the engine's own earlier replies as
  OpenClaw would.

Prints per turn the prompt and cached tokens, time to first token, total time and finish
reason (or the engine's refusal: a prompt longer than the context), and the turn-1 /
later-turns ratio of time to first token.

Run: python bench/openclaw_bench.py [--model smollm2-135m|NAME|PATH] [--max-tokens 32]
        [--profile full|small|both] [--max-model-len N] [--url http://gateway:8000]

SmolLM2-135M's context is 8,192 tokens: the full profile is refused there, as a user meets it;
pass `--max-model-len 32768` to time its prefill anyway (its answers past 8k are not
meaningful). `--url` sends the turns through a running gateway (`claw-stream up`) instead of
starting an engine; the cache-off run is then skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
PROFILES = {"full": "session.jsonl", "small": "small-profile-session.jsonl"}
TURNS = 3  # the first three requests of each session, in order


@dataclass
class Turn:
    index: int
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    total_s: float
    finish: str
    reply: str = ""


def session_records(profile: str) -> list[dict[str, Any]]:
    path = OPENCLAW / PROFILES[profile]
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return records[:TURNS]


def replay(url: str, body: dict[str, Any], index: int, max_tokens: int) -> Turn:
    body = {**body, "max_completion_tokens": max_tokens, "temperature": 0.0}
    body["stream_options"] = {"include_usage": True}
    started = time.perf_counter()
    first: float | None = None
    usage: dict[str, Any] = {}
    finish = "?"
    reply: list[str] = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=1800) as r:
        if r.status_code != 200:
            r.read()
            error = (r.json().get("error") or {}) if r.text.startswith("{") else {}
            why = str(error.get("message") or r.text)
            tokens = re.search(r"has (\d+) input tokens", why)
            took = time.perf_counter() - started
            if tokens:  # the engine's context error
                return Turn(index, int(tokens.group(1)), 0, 0.0, took, "refused: context")
            return Turn(index, 0, 0, 0.0, took, f"refused: {why[:60]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if first is None and delta:
                    first = time.perf_counter()
                reply.append(delta.get("content") or "")
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
        "".join(reply),
    )


def conversation(url: str, profile: str, max_tokens: int, console: Console) -> list[Turn]:
    """The profile's requests in order; the small profile's carry the engine's own replies
    where the recording stub's answers were (the full profile's turn 1 ends in a tool call
    whose result the next request carries, so its history is kept as recorded)."""
    replies: dict[str, str] = {}
    turns = []
    for index, record in enumerate(session_records(profile), 1):
        body = json.loads(json.dumps(record["body"]))
        for message in body["messages"]:
            if message["role"] == "assistant" and message.get("content") in replies:
                message["content"] = replies[message["content"]]
        with console.status(f"{profile} profile, turn {index}…"):
            turn = replay(url, body, index, max_tokens)
        if "answer" in record and turn.reply:
            replies[record["answer"]] = turn.reply
        turns.append(turn)
    return turns


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
    parser.add_argument("--profile", choices=("full", "small", "both"), default="both")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--url", default=None, help="a running gateway or engine")
    args = parser.parse_args()
    console = Console()
    profiles = ("small", "full") if args.profile == "both" else (args.profile,)

    def sessions(url: str) -> dict[str, list[Turn]]:
        return {p: conversation(url, p, args.max_tokens, console) for p in profiles}

    runs: dict[str, dict[str, list[Turn]]] = {}
    if args.url:
        runs["through " + args.url] = sessions(args.url)
        label = args.url
    else:
        path = ensure_model(args.model, load_settings().models_dir)
        label = path.name
        runs["prefix cache on"] = with_engine(path, 1024, args.max_model_len, sessions)
        runs["prefix cache off"] = with_engine(path, 0, args.max_model_len, sessions)

    table = Table(title=f"OpenClaw sessions replayed: {label}, up to {args.max_tokens} tokens")
    for column in ("run", "profile", "turn", "prompt", "cached", "TTFT s", "total s", "finish"):
        table.add_column(column, justify="right")
    for name, by_profile in runs.items():
        for profile, turns in by_profile.items():
            for t in turns:
                table.add_row(
                    name,
                    profile,
                    str(t.index),
                    str(t.prompt_tokens),
                    str(t.cached_tokens),
                    f"{t.ttft_s:.2f}",
                    f"{t.total_s:.2f}",
                    t.finish,
                )
    console.print(table)
    for name, by_profile in runs.items():
        for profile, turns in by_profile.items():
            answered = [t for t in turns if not t.finish.startswith("refused")]
            if len(answered) < 2:
                console.print(
                    f"{name}, {profile} profile: refused (the prompt exceeds the context)"
                )
                continue
            later = sum(t.ttft_s for t in answered[1:]) / len(answered[1:])
            console.print(
                f"{name}, {profile} profile: TTFT turn 1 {answered[0].ttft_s:.2f} s, "
                f"later turns {later:.2f} s ({answered[0].ttft_s / later:.1f}x)"
            )


if __name__ == "__main__":
    main()
