"""Stream-processor throughput and latency, beside a raw aiokafka pass-through, in one run.

Starts a private Tansu broker, an embedded PostgreSQL, an instant judge (an OpenAI-protocol
server answering at once) and one real `claw-stream worker`, then measures:
  - throughput: steps/s from claw.steps to claw.samples for a burst of sessions
    (each: `--turns` main steps, the user thanking the agent, then an `ended` event);
  - latency: from a session's `ended` event to its first sample on the topic, p50 / p99, for
    sessions sent at a steady pace (`--rate` sessions/s);
  - the baseline: a plain aiokafka consume-and-produce (acks=all) of the same step records.
Run: python bench/pipeline_bench.py [--sessions 150] [--turns 3] [--paced 30] [--rate 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psutil
from aiokafka import TopicPartition
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from claw_stream.bus.kafka import make_consumer, make_producer, wait_for_broker  # noqa: E402
from claw_stream.bus.topics import apply_topics, load_specs  # noqa: E402
from claw_stream.embedded.broker import broker_command  # noqa: E402
from claw_stream.embedded.postgres import EmbeddedPostgres  # noqa: E402
from claw_stream.events import SessionEvent, encode_event  # noqa: E402
from claw_stream.names import Topics  # noqa: E402
from claw_stream.store import migrate  # noqa: E402
from tests.support.processes import free_port  # noqa: E402
from tests.support.worker import JudgeStub, WorkerProcess, chat, create_topics  # noqa: E402


class SampleWatch:
    """Follows the samples topic: when each session's first sample arrived, and when each
    sample did (perf_counter: a burst's end is the last sample's arrival, not the next wake-up
    of `wait`, whose 0.1 s steps were a tenth of a 150-session burst)."""

    def __init__(self, bootstrap: str, topic: str):
        self.bootstrap, self.topic = bootstrap, topic
        self.first: dict[str, float] = {}
        self.arrived: list[float] = []
        self.count = 0

    async def run(self) -> None:
        consumer = make_consumer(self.bootstrap)
        await consumer.start()
        try:
            await consumer.topics()  # metadata of every topic
            parts = [
                TopicPartition(self.topic, p) for p in consumer.partitions_for_topic(self.topic)
            ]
            consumer.assign(parts)
            await consumer.seek_to_beginning(*parts)
            while True:
                batch = await consumer.getmany(timeout_ms=200)
                now, at = time.time(), time.perf_counter()
                for records in batch.values():
                    for r in records:
                        self.count += 1
                        self.arrived.append(at)
                        self.first.setdefault(json.loads(r.value)["session_id"], now)
        finally:
            await consumer.stop()

    async def wait(self, n: int, timeout_s: float, progress: Progress | None = None) -> None:
        deadline = time.monotonic() + timeout_s
        task = progress.add_task("samples", total=n) if progress else None
        while self.count < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.count} of {n} samples after {timeout_s:.0f}s")
            if progress is not None and task is not None:
                progress.update(task, completed=self.count)
            await asyncio.sleep(0.1)
        if progress is not None and task is not None:
            progress.update(task, completed=n)


async def send_sessions(bootstrap: str, topics: Topics, sessions: list[list]) -> None:
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        futures = []
        for steps in sessions:
            sid = steps[0].session_id
            for s in steps:
                futures.append(await producer.send(topics.steps, encode_event(s), key=sid.encode()))
            end = SessionEvent(session_id=sid, kind="ended", n_steps=len(steps))
            futures.append(
                await producer.send(topics.session_events, encode_event(end), key=sid.encode())
            )
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def raw_pass_through(bootstrap: str, source: str, n: int) -> float:
    """Consume n records of `source` and produce each to another topic: records/s."""
    sink = f"{source}.raw-{uuid.uuid4().hex[:6]}"
    (steps,) = [s for s in load_specs() if s.name == "claw.steps"]
    await apply_topics(bootstrap, [steps.model_copy(update={"name": sink})])  # never auto-created
    consumer = make_consumer(bootstrap, source, group_id=f"raw-{uuid.uuid4().hex[:6]}")
    producer = make_producer(bootstrap)
    await consumer.start()
    await producer.start()
    try:
        got, futures = 0, []
        start = time.perf_counter()
        while got < n:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for r in records:
                    futures.append(await producer.send(sink, r.value, key=r.key))
                    got += 1
        await asyncio.gather(*futures)
        await consumer.commit()
        return n / (time.perf_counter() - start)
    finally:
        await consumer.stop()
        await producer.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=150)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--paced", type=int, default=30, help="Sessions in the latency phase.")
    parser.add_argument("--rate", type=float, default=3.0, help="Paced sessions per second.")
    parser.add_argument("--release", choices=["per_turn", "per_episode"], default="per_turn")
    parser.add_argument("--prm-votes", type=int, default=3, help="PRM votes per judged turn.")
    parser.add_argument(
        "--signal-grace",
        type=float,
        default=0.0,
        help="per_turn: wait for thumbs after a judgement (no thumbs are sent here).",
    )
    args = parser.parse_args()
    console = Console(width=120)
    tmp = Path(tempfile.mkdtemp(prefix="pipeline-bench-"))
    procs: list[subprocess.Popen] = []
    broker_port = free_port()
    bootstrap = f"127.0.0.1:{broker_port}"
    procs.append(
        subprocess.Popen(
            broker_command("127.0.0.1", broker_port),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    )
    pg = EmbeddedPostgres(tmp / "pg", "127.0.0.1", free_port(), "claw", "claw")
    pg.ensure_initialised()
    procs.append(
        subprocess.Popen(
            pg.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **pg.popen_kwargs()
        )
    )
    judge = JudgeStub()
    worker: WorkerProcess | None = None

    async def run() -> None:
        nonlocal worker
        await wait_for_broker(bootstrap)
        await pg.wait_ready()
        await pg.ensure_database()
        await migrate.upgrade(pg.url)
        topics = await create_topics(bootstrap, "bench")  # as specified: 6 partitions
        worker = WorkerProcess(
            bootstrap,
            pg.url,
            tmp / "worker",
            topics,
            app_id="bench-worker",
            judge_url=judge.url,
            sweep_interval_s=0.5,
            release=args.release,
            signal_grace_s=args.signal_grace,
            prm_votes=args.prm_votes,
        )
        watch = SampleWatch(bootstrap, topics.samples)
        follower = asyncio.create_task(watch.run())
        replies = ["Do the task."] + ["thanks"] * (args.turns - 1)
        # warm-up: the worker has joined its group and answers
        await send_sessions(bootstrap, topics, [chat("warm-up", replies)])
        await watch.wait(1, 180)
        base = watch.count
        per_session = args.turns - 1  # the last turn has no next state: no sample
        sessions = [chat(f"b{i}", replies) for i in range(args.sessions)]
        n_steps = args.sessions * args.turns
        assert worker.proc is not None
        worker_cpu = psutil.Process(worker.proc.pid)
        with Progress(console=console, transient=True) as progress:
            start, cpu_start = time.perf_counter(), worker_cpu.cpu_times()
            await send_sessions(bootstrap, topics, sessions)
            await watch.wait(base + args.sessions * per_session, 600, progress)
            cpu_end = worker_cpu.cpu_times()
        elapsed = watch.arrived[base + args.sessions * per_session - 1] - start
        cpu_s = sum(cpu_end[:2]) - sum(cpu_start[:2])  # user + system, every thread
        pipeline_rate = n_steps / elapsed

        latencies = []
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("paced sessions", total=args.paced)
            paced = [chat(f"p{i}", replies) for i in range(args.paced)]
            ended: dict[str, datetime] = {}
            for steps in paced:
                await send_sessions(bootstrap, topics, [steps])
                ended[steps[0].session_id] = datetime.now(UTC)
                progress.advance(task)
                await asyncio.sleep(1 / args.rate)
            deadline = time.monotonic() + 120
            while any(s not in watch.first for s in ended) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        for sid, at in ended.items():
            if sid in watch.first:
                latencies.append(watch.first[sid] - at.timestamp())
        follower.cancel()

        raw_rate = await raw_pass_through(bootstrap, topics.steps, n_steps)
        table = Table(title=f"pipeline: {args.sessions} sessions x {args.turns} steps, 1 worker")
        table.add_column("figure")
        table.add_column("value", justify="right")
        table.add_row("worker: steps/s, claw.steps -> claw.samples", f"{pipeline_rate:,.0f}")
        table.add_row("raw aiokafka consume + produce: records/s", f"{raw_rate:,.0f}")
        table.add_row("ratio worker / raw", f"{pipeline_rate / raw_rate:.3f}")
        table.add_row("worker CPU per step (user + system)", f"{cpu_s / n_steps * 1000:.2f} ms")
        table.add_row("worker CPU use during the burst", f"{cpu_s / elapsed:.2f} cores")
        if latencies:
            q = statistics.quantiles(latencies, n=100)
            table.add_row(
                f"session end -> sample, p50 ({args.rate:g} sessions/s)", f"{q[49] * 1000:.0f} ms"
            )
            table.add_row("session end -> sample, p99", f"{q[98] * 1000:.0f} ms")
        table.add_row(
            f"judge requests ({args.prm_votes} PRM votes per judged turn)",
            str(judge.calls.get("prm", 0)),
        )
        console.print(table)

    try:
        asyncio.run(run())
    finally:
        if worker is not None:
            worker.stop()
        judge.stop()
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=20)


if __name__ == "__main__":
    main()
