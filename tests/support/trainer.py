"""The trainer as the tests run it: scripted samples in, a trainer process, what it published."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path

import httpx

from claw_stream.bus.kafka import make_producer, publish
from claw_stream.engine.chat_format import render_prompt
from claw_stream.events import Sample, WeightEvent, decode_event
from claw_stream.ids import uuid7

from . import topic_reads
from .engine import PROMPT, EngineProcess
from .processes import child_env, free_port
from .service_logs import watch


def make_samples(
    tokenizer, answers: list[tuple[str, float]], group: str | None = None
) -> list[Sample]:
    prompt = render_prompt(tokenizer, PROMPT, None, None)
    out = []
    for text, reward in answers:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        out.append(
            Sample(
                sample_id=uuid7(),
                session_id=f"s-{uuid.uuid4().hex[:6]}",
                group_id=group,
                step_id=uuid7(),
                turn_id=uuid7(),
                method="binary",
                prompt_token_ids=prompt,
                response_token_ids=ids,
                response_logprobs=[-1.0] * len(ids),
                reward=reward,
                reward_source="feedback",
                weight_version=0,
                released_at_version=0,
            )
        )
    return out


class TrainerRun:
    def __init__(self, env: dict[str, str], model: Path, log: Path, *args: str, ranks: int = 1):
        self.log = log
        # several ranks as `deepspeed --num_gpus N` starts them (torchrun: the same env vars)
        distributed = ["torch.distributed.run", f"--nproc-per-node={ranks}"]
        distributed += [f"--master-port={free_port()}", "-m"]
        launch = [sys.executable, "-m", *(distributed if ranks > 1 else [])]
        self.proc = subprocess.Popen(
            [*launch, "claw_stream", "trainer", "--model", str(model), *args],
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            env=child_env(**env),
        )
        watch("trainer", log)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def produce(broker: str, topic: str, samples: list[Sample], key: str | None = None) -> None:
    """Keyed by session (spread over partitions) unless one key puts them in order."""

    async def run() -> None:
        producer = make_producer(broker)
        await producer.start()
        for s in samples:
            await publish(producer, topic, key or s.session_id, s)
        await producer.stop()

    asyncio.run(run())


def weight_events(broker: str, policy: str) -> list[WeightEvent]:
    """The policy's weight events, in their order (one partition: they are keyed by policy)."""
    records = asyncio.run(topic_reads.records(broker, "claw.weights"))
    return [decode_event(WeightEvent, r.value) for r in records if r.key == policy.encode()]


def served_version(engine: EngineProcess) -> int:
    return httpx.get(engine.base_url + "/v1/models").json()["data"][0]["weight_version"]
