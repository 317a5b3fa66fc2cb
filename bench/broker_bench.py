"""Event-contract and broker throughput on this machine, for agent-sized Steps.

Starts a private Tansu broker, then measures in one run:
  - encode + strict validation of Step events (pydantic) vs plain json.dumps/json.loads;
  - produce (acks=all) and consume throughput of those Steps through aiokafka.
Run: python bench/broker_bench.py [--events N] [--prompt-kb KB]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import time
import uuid

from rich.console import Console
from rich.table import Table

from claw_stream.bus.kafka import make_consumer, make_producer, wait_for_broker
from claw_stream.bus.topics import apply_topics, load_specs
from claw_stream.embedded.broker import broker_command
from claw_stream.events import ChatMessage, Step, decode_event, encode_event
from tests.support.factories import make_step


def agent_sized_step(prompt_kb: int) -> Step:
    step = make_step()
    system = ChatMessage(role="developer", content="x" * (prompt_kb * 1024))
    messages = [system, *step.request.messages[1:]]
    return step.model_copy(
        update={
            "request": step.request.model_copy(update={"messages": messages}),
            "prompt_token_ids": list(range(prompt_kb * 256)),
            "response_token_ids": list(range(200)),
            "response_logprobs": [-0.5] * 200,
        }
    )


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


async def broker_rates(bootstrap: str, payloads: list[bytes]) -> tuple[float, float]:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    (steps,) = [s for s in load_specs() if s.name == "claw.steps"]
    await apply_topics(bootstrap, [steps.model_copy(update={"name": topic})])  # never auto-created
    producer = make_producer(bootstrap)
    await producer.start()
    start = time.perf_counter()
    futures = [
        await producer.send(topic, p, key=b"sess-%d" % (i % 64)) for i, p in enumerate(payloads)
    ]
    await asyncio.gather(*futures)
    produce_s = time.perf_counter() - start
    await producer.stop()
    consumer = make_consumer(bootstrap, topic, group_id=topic)
    await consumer.start()
    got, start = 0, time.perf_counter()
    while got < len(payloads):
        batch = await consumer.getmany(timeout_ms=5_000)
        if not batch:
            break
        got += sum(len(m) for m in batch.values())
    consume_s = time.perf_counter() - start
    await consumer.stop()
    return rate(len(payloads), produce_s), rate(got, consume_s)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--prompt-kb", type=int, default=48)
    args = parser.parse_args()

    step = agent_sized_step(args.prompt_kb)
    payload = encode_event(step)
    n = args.events

    start = time.perf_counter()
    encoded = [encode_event(step) for _ in range(n)]
    encode_s = time.perf_counter() - start
    start = time.perf_counter()
    for raw in encoded:
        decode_event(Step, raw)
    decode_s = time.perf_counter() - start
    plain = step.model_dump(mode="json")
    start = time.perf_counter()
    for _ in range(n):
        json.loads(json.dumps(plain))
    plain_s = time.perf_counter() - start

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(broker_command("127.0.0.1", port), stdout=subprocess.DEVNULL)
    try:
        bootstrap = f"127.0.0.1:{port}"
        asyncio.run(wait_for_broker(bootstrap))
        produce_rate, consume_rate = asyncio.run(broker_rates(bootstrap, encoded))
    finally:
        proc.terminate()
        proc.wait()

    mb = len(payload) / 1e6
    table = Table(title=f"{n} Steps of {len(payload) / 1024:.0f} KB ({args.prompt_kb} KB prompt)")
    table.add_column("what")
    table.add_column("events/s", justify="right")
    table.add_column("MB/s", justify="right")
    rows = [
        ("encode (model_dump_json)", rate(n, encode_s)),
        ("decode + strict validation", rate(n, decode_s)),
        ("plain json.dumps + json.loads", rate(n, plain_s)),
        ("produce to Tansu, acks=all", produce_rate),
        ("consume from Tansu", consume_rate),
    ]
    for label, r in rows:
        table.add_row(label, f"{r:,.0f}", f"{r * mb:,.1f}")
    console = Console()
    console.print(table)
    console.print(
        f"validated encode+decode vs plain JSON round trip: "
        f"{(encode_s + decode_s) / plain_s:.2f}x the time"
    )


if __name__ == "__main__":
    main()
