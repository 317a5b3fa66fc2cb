"""A long-lived conversation judged by a standalone `claw-stream worker` at its default judge
settings, the CPU engine (SmolLM2-135M) as its judge: how long after the conversation's end
until every turn is trained, the turns after its idle pauses included.

The stack is `claw-stream up --no-worker --no-trainer` (broker, Postgres, engine, gateway);
the worker is started apart, as a user starts one (`claw-stream worker --judge-url <engine>`),
so none of `up`'s bounds on the engine as judge apply. Only its idle timeout is shortened
(`--idle-s`, 900 s by default) so that the conversation's pauses close its segments. Each
condition is one conversation of three parts of three user messages, a pause longer than the
idle timeout between parts, then `/rl/end_session`; its worker is stopped after it, and the
next condition's worker takes over the same consumer group.

- `default`: the worker's defaults: a judge that shows no thinking gets
  `judge_plain_max_tokens` (128) a vote;
- `room`: `worker.judge_thinks: true`: every vote gets `judge_max_tokens` (4,096), as every
  vote did before the plain room.

Prints per condition the seconds from the end of the conversation until all nine turns were
judged and sampled or held out for evaluation (`eval.holdout_share`), or how many were by
`--deadline`; the turns done after the pauses, and the mean length of the judge's votes.
Run: python bench/long_conversation_bench.py [--conditions default,room] [--deadline 240]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.stack import new_stack, running  # noqa: E402
from claw_stream.names import policy_model  # noqa: E402

CONDITIONS = {"default": {}, "room": {"CLAW_WORKER__JUDGE_THINKS": "true"}}
PARTS = [
    ["Plan my week.", "thanks, and Monday?", "thanks. Tuesday?"],
    ["thanks! I'm back: what about Wednesday?", "thanks, Thursday?", "thanks. Friday?"],
    ["thanks, good morning: the weekend?", "thanks. Sunday?", "thanks, that is all."],
]
TURNS = sum(len(p) for p in PARTS)
Worker = subprocess.Popen[bytes]


@dataclass
class Outcome:
    condition: str
    seconds: float | None  # from the end until every turn was sampled; None: not by the deadline
    sampled: int
    resumed_sampled: int  # of the turns after the pauses (segments 1 and 2)
    vote_chars: float


async def until(
    probe: Callable[[], Awaitable[bool]], what: str, deadline_s: float, worker: Worker
) -> None:
    started = time.monotonic()
    while not await probe():
        if worker.poll() is not None:
            raise SystemExit(f"the worker exited while waiting for {what}")
        if time.monotonic() - started > deadline_s:
            raise SystemExit(f"no {what} within {deadline_s:.0f} s")
        await asyncio.sleep(0.5)


async def conversation(
    gateway: str, admin: str, model: str, dsn: str, args: argparse.Namespace, worker: Worker
) -> tuple[str, float, asyncpg.Connection]:
    """One conversation of three parts with pauses between; returns its session, the time it
    ended, and a database connection."""
    db = await asyncpg.connect(dsn)
    async with httpx.AsyncClient(base_url=gateway, timeout=120) as http:
        r = await http.post(
            "/rl/start_session", json={}, headers={"Authorization": f"Bearer {admin}"}
        )
        r.raise_for_status()
        session, key = r.json()["session_id"], r.json()["api_key"]
        history = [{"role": "system", "content": "You are my assistant."}]
        for k, part in enumerate(PARTS):
            for text in part:
                history.append({"role": "user", "content": text})
                r = await http.post(
                    "/v1/chat/completions",
                    json={"model": model, "messages": history, "max_tokens": args.answer_tokens},
                    headers={"Authorization": f"Bearer {key}"},
                )
                r.raise_for_status()
                answer = r.json()["choices"][0]["message"]["content"] or ""
                history.append({"role": "assistant", "content": answer})
            if k < len(PARTS) - 1:  # a pause longer than the idle timeout closes the segment

                async def closed(k: int = k) -> bool:
                    row = await db.fetchrow(
                        "SELECT 1 FROM pipeline_segments WHERE session_id = $1 AND segment = $2"
                        " AND closed_at IS NOT NULL",
                        session,
                        k,
                    )
                    return row is not None

                await until(closed, f"segment {k} closed by idle", args.idle_s + 120, worker)
        r = await http.post("/rl/end_session", json={}, headers={"Authorization": f"Bearer {key}"})
        r.raise_for_status()
    return session, time.monotonic(), db


async def measure(
    condition: str,
    gateway: str,
    admin: str,
    model: str,
    dsn: str,
    args: argparse.Namespace,
    worker: Worker,
) -> Outcome:
    session, ended, db = await conversation(gateway, admin, model, dsn, args, worker)
    # a turn is done once sampled, or held out of training for evaluation (eval.holdout_share)
    query = (
        "SELECT t.segment, COALESCE(x.status, CASE WHEN j.judge_model = 'held-out'"
        " THEN 'held out' END) AS status FROM turns t"
        " LEFT JOIN samples x ON x.turn_id = t.turn_id"
        " LEFT JOIN judgements j ON j.turn_id = t.turn_id WHERE t.session_id = $1"
    )
    seconds: float | None = None
    rows = []
    while time.monotonic() - ended < args.deadline:
        rows = await db.fetch(query, session)
        if len(rows) == TURNS and all(r["status"] for r in rows):
            seconds = time.monotonic() - ended
            break
        if worker.poll() is not None:
            raise SystemExit("the worker exited")
        await asyncio.sleep(0.5)
    votes = await db.fetch(
        "SELECT jsonb_array_elements_text(payload->'prm_raw') AS raw FROM judgements"
        " WHERE session_id = $1",
        session,
    )
    await db.close()
    raw = [len(v["raw"]) for v in votes]
    return Outcome(
        condition,
        seconds,
        sum(1 for r in rows if r["status"]),
        sum(1 for r in rows if r["status"] and r["segment"] > 0),
        sum(raw) / len(raw) if raw else 0.0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conditions", default="default,room")
    parser.add_argument("--deadline", type=float, default=240.0, help="seconds after the end")
    parser.add_argument("--idle-s", type=float, default=5.0, help="the worker's idle timeout")
    parser.add_argument("--answer-tokens", type=int, default=48)
    args = parser.parse_args()
    console = Console()
    stack = new_stack("long-conversation-")
    ports = stack.ports
    outcomes: list[Outcome] = []
    with running(stack, "--no-worker", "--no-trainer", console=console):
        models = httpx.get(
            f"{stack.gateway}/v1/models", headers={"Authorization": f"Bearer {stack.admin}"}
        ).json()["data"]
        model = policy_model(models)
        for condition in args.conditions.split(","):
            worker_env = {
                **stack.env,
                "CLAW_KAFKA_BOOTSTRAP": f"127.0.0.1:{ports['broker']}",
                "CLAW_WORKER__IDLE_TIMEOUT_S": str(args.idle_s),
                **CONDITIONS[condition],
            }
            with (stack.data / f"worker-{condition}.log").open("w") as worker_log:
                worker = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "claw_stream",
                        "worker",
                        "--judge-url",
                        f"{stack.engine}/v1",
                        "--metrics-port",
                        str(ports["w"]),
                    ],
                    stdout=worker_log,
                    stderr=subprocess.STDOUT,
                    env=worker_env,
                )
            try:
                with console.status(f"{condition}: a conversation in three parts, then judged"):
                    outcome = asyncio.run(
                        measure(
                            condition, stack.gateway, stack.admin, model, stack.dsn, args, worker
                        )
                    )
            finally:
                worker.send_signal(signal.SIGTERM)
                try:
                    worker.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    worker.kill()
            outcomes.append(outcome)
            took = f"{outcome.seconds:.0f} s" if outcome.seconds is not None else "not yet"
            console.print(
                f"{condition}: all turns trained {took} after the end "
                f"({outcome.sampled}/{TURNS} done, {outcome.resumed_sampled} after pauses)"
            )
    table = Table(title=f"a standalone worker's judge: the CPU engine ({TURNS} turns, 2 pauses)")
    table.add_column("condition")
    table.add_column("all trained after the end", justify="right")
    table.add_column("done by the deadline", justify="right")
    table.add_column("after the pauses", justify="right")
    table.add_column("mean vote (chars)", justify="right")
    for o in outcomes:
        table.add_row(
            o.condition,
            f"{o.seconds:.1f} s" if o.seconds is not None else f"> {args.deadline:.0f} s",
            f"{o.sampled}/{TURNS}",
            f"{o.resumed_sampled}/{TURNS - len(PARTS[0])}",
            f"{o.vote_chars:.0f}",
        )
    console.print(table)
    timed = {o.condition: o.seconds for o in outcomes}
    default, room = timed.get("default"), timed.get("room")
    if default and room:
        console.print(f"room / default: {room / default:.1f}x")


if __name__ == "__main__":
    main()
