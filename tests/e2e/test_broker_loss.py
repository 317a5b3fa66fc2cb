"""Nothing answered is lost when the broker dies: the embedded broker SIGKILLed and restarted
empty (as the supervisor restarts it, topics applied a second later), the gateway SIGKILLed and
restarted, the worker SIGKILLed too; and a broker that comes back with `claw.steps` of the wrong
partition count."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections import defaultdict
from pathlib import Path

import asyncpg
import httpx
import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import CommitFailedError

from claw_stream.bus.kafka import make_consumer, make_producer, read_to_end
from claw_stream.bus.topics import apply_topics, load_specs
from claw_stream.events import Sample, SessionEvent
from claw_stream.store.db import asyncpg_dsn

from ..fixtures.broker import Broker
from ..support.gateway import GatewayProcess, read_steps
from ..support.postgres import new_database
from ..support.traffic import Traffic, calls
from ..support.worker import (
    JudgeStub,
    WorkerProcess,
    chat,
    create_topics,
    events_on,
    new_id,
    private_worker,
    send,
    wait_for,
)


async def archived(url: str, step_ids: list[str]) -> set[str]:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await conn.fetch(
            "SELECT step_id::text AS id FROM steps WHERE step_id = ANY($1::uuid[])",
            [uuid.UUID(s) for s in step_ids],
        )
    finally:
        await conn.close()
    return {r["id"] for r in rows}


@pytest.mark.parametrize("worker_killed", [False, True], ids=["worker-lives", "worker-killed"])
def test_broker_and_gateway_killed_under_traffic_lose_no_answered_step(
    restartable_broker: Broker, postgres, tools_engine, tmp_path: Path, worker_killed: bool
) -> None:
    """Within 60 s of the end every answered call's Step is in the archive (exactly once: the
    archive is keyed by step id, and no Step of an unanswered call beyond those in flight
    appears), and the gateway's spool and journal are empty."""
    broker = restartable_broker
    url = new_database(postgres, "loss")
    (tmp_path / "gateway").mkdir()
    judge = JudgeStub()
    group = new_id("loss")
    worker = WorkerProcess(
        broker.bootstrap, url, tmp_path / "worker", app_id=group, judge_url=judge.url
    )
    gateway = GatewayProcess(
        broker.bootstrap,
        url,
        [tools_engine.base_url],
        tmp_path / "gateway",
        env={"CLAW_GATEWAY__RESEND_AFTER_S": "3", "CLAW_WORKER__APP_ID": group},
    )
    sessions = [f"loss-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
    answered: dict[str, list[str]] = defaultdict(list)
    try:

        async def scenario() -> int:
            # the worker archives before the outage starts
            warm: dict[str, list[str]] = defaultdict(list)
            await calls(gateway.base_url, [f"warm-{uuid.uuid4().hex[:6]}"], 3, warm, "warm-up")
            ids = [i for v in warm.values() for i in v]
            deadline = time.monotonic() + 120
            while len(await archived(url, ids)) < len(ids):
                assert time.monotonic() < deadline, "the worker never archived"
                await asyncio.sleep(0.5)
            traffic = Traffic(gateway.base_url, sessions, answered).start()
            try:
                await traffic.more(6, "before the outage")
                if worker_killed:  # what the broker takes from now on waits unconsumed
                    await asyncio.to_thread(worker.kill)
                    await traffic.more(6, "with the worker killed")
                await asyncio.to_thread(broker.kill)  # its records are gone
                await asyncio.to_thread(broker.start, apply=False)
                # the supervisor applies the topics a moment later: calls go on meanwhile
                await traffic.more(3, "before the topics are back")
                await apply_topics(broker.bootstrap)
                await traffic.more(6, "with the topics back")
                await asyncio.to_thread(gateway.kill)
                await asyncio.to_thread(gateway.start)
                if worker_killed:
                    await traffic.more(3, "with the worker still away")
                    await asyncio.to_thread(worker.start)
                await traffic.until(31, "after the gateway's restart")
            finally:
                failures = await traffic.stop()
            return failures

        failures = asyncio.run(scenario())
        ids = [i for v in answered.values() for i in v]
        assert len(ids) > 30, f"only {len(ids)} calls answered ({failures} failed)"
        deadline = time.monotonic() + 60
        while (missing := set(ids) - asyncio.run(archived(url, ids))) or gateway_pending(gateway):
            assert time.monotonic() < deadline, (
                f"{len(missing)} of {len(ids)} answered Steps not in the archive; "
                f"gateway: {httpx.get(gateway.base_url + '/healthz').json()}\n"
                f"worker log: {worker.log()[-1500:]}"
            )
            time.sleep(1.0)
        in_archive = asyncio.run(archived_of_sessions(url, sessions))
        # calls the gateway was serving when it was killed may have made Steps nobody saw
        assert len(in_archive - set(ids)) <= len(sessions)
    finally:
        gateway.stop()
        worker.stop()
        judge.stop()


def gateway_pending(gateway: GatewayProcess) -> bool:
    health = httpx.get(gateway.base_url + "/healthz").json()
    return health["spooled"] > 0 or health.get("unarchived", 0) > 0


async def archived_of_sessions(url: str, sessions: list[str]) -> set[str]:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await conn.fetch(
            "SELECT step_id::text AS id FROM steps WHERE session_id = ANY($1::text[])", sessions
        )
    finally:
        await conn.close()
    return {r["id"] for r in rows}


def topic_wrong(gateway: GatewayProcess, topic: str) -> float:
    metrics = httpx.get(gateway.base_url + "/metrics").text
    found = re.search(
        rf'^claw_gateway_topic_wrong{{topic="{re.escape(topic)}"}} ([0-9.]+)$', metrics, re.M
    )
    assert found, metrics
    return float(found.group(1))


def test_a_topic_with_the_wrong_partition_count_is_reported_and_loses_nothing(
    database, tools_engine, tmp_path: Path
) -> None:
    """The broker came back with `claw.steps` auto-created (4 partitions, the spec says 6):
    the gateway keeps serving, writes nothing to it, says so on /healthz and /metrics, and
    once an operator recreated the topic every answered call's Step is on it, once."""
    broker = Broker()
    broker.start(apply=False)
    steps_spec = next(s for s in load_specs() if s.name == "claw.steps")

    async def wrong_topic() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic("claw.steps", 4, 1)])
        finally:
            await admin.close()
        await apply_topics(broker.bootstrap)  # the others as specified; claw.steps drifts

    asyncio.run(wrong_topic())
    gateway = GatewayProcess(broker.bootstrap, database, [tools_engine.base_url], tmp_path)
    sessions = [f"wrong-{i}-{uuid.uuid4().hex[:6]}" for i in range(2)]
    answered: dict[str, list[str]] = defaultdict(list)
    try:
        failures = asyncio.run(calls(gateway.base_url, sessions, 5, answered, "wrong topic"))
        assert failures == 0 and sum(len(v) for v in answered.values()) > 4
        health = httpx.get(gateway.base_url + "/healthz").json()
        assert health["status"] == "degraded", health
        assert any("claw.steps" in p and "partitions 4" in p for p in health["problems"])
        assert health["spooled"] >= sum(len(v) for v in answered.values())
        assert topic_wrong(gateway, "claw.steps") == 1.0
        assert read_steps(broker.bootstrap, set(sessions)) == []  # nothing written to it

        async def recreate() -> None:  # what the operator does
            admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
            await admin.start()
            try:
                await admin.delete_topics(["claw.steps"])
            finally:
                await admin.close()
            await apply_topics(broker.bootstrap, [steps_spec])

        asyncio.run(recreate())
        deadline = time.monotonic() + 60
        while (health := httpx.get(gateway.base_url + "/healthz").json())["spooled"]:
            assert time.monotonic() < deadline, health
            time.sleep(0.5)
        assert health["status"] == "ok", health
        assert topic_wrong(gateway, "claw.steps") == 0.0
        on_topic = defaultdict(list)
        for step in read_steps(broker.bootstrap, set(sessions)):
            on_topic[step.session_id].append(str(step.step_id))
        assert dict(on_topic) == dict(answered)
    finally:
        gateway.stop()
        broker.stop()


async def test_samples_the_broker_lost_before_the_trainer_saw_them_are_published_again(
    postgres, tmp_path: Path
) -> None:
    """Two samples published; the trainer recorded one (`trained_in_step`); the broker dies
    and comes back empty: the worker publishes the untrained one again, not the other."""
    broker = Broker()
    await asyncio.to_thread(broker.start)
    judge = JudgeStub()
    worker, topics, url = await private_worker(
        broker.bootstrap,
        postgres,
        tmp_path / "worker",
        "lost-samples",
        judge_url=judge.url,
        retrain_after_s=2,
        lost_check_every_s=1,
    )
    try:
        steps = chat(new_id("s"), ["Do it.", "thanks", "Thanks again."])
        await send(broker.bootstrap, topics.steps, steps)
        ended = SessionEvent(session_id=steps[0].session_id, kind="ended", n_steps=3)
        await send(broker.bootstrap, topics.session_events, [ended])

        async def samples() -> list[Sample]:
            return await events_on(broker.bootstrap, topics.samples, Sample)

        published = await wait_for(lambda: _at_least(samples, 2), "the samples", timeout_s=120)
        trained, untrained = sorted(s.sample_id for s in published)
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:  # what the trainer records after its step
            await conn.execute(
                "UPDATE samples SET trained_in_step = 1 WHERE sample_id = $1", trained
            )
        finally:
            await conn.close()
        await asyncio.to_thread(broker.kill)
        await asyncio.to_thread(broker.start, apply=False)
        prefix = topics.steps.removesuffix(".claw.steps")
        await create_topics(broker.bootstrap, prefix)  # as the supervisor applies them
        again = await wait_for(lambda: _at_least(samples, 1), "the lost sample", timeout_s=90)
        await asyncio.sleep(3)  # a few more sweeps: nothing else comes
        assert [s.sample_id for s in await samples()] == [untrained]
        assert again[0] == next(s for s in published if s.sample_id == untrained)
    finally:
        worker.stop()
        judge.stop()
        broker.stop()


async def _at_least(probe, n: int):
    found = await probe()
    return found if len(found) >= n else None


async def test_a_commit_from_before_a_broker_restart_never_lands_on_the_new_log() -> None:
    """A consumer read 10 records; the broker restarts empty and its group forgets the member;
    the consumer's next commit (offset 10) fails while the topic is missing, and must not land
    once the topic is back: the new log's first records would be skipped."""
    broker = Broker()
    await asyncio.to_thread(broker.start, apply=False)
    tp = TopicPartition("stale", 0)

    async def create_and_fill(tag: str, n: int) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic("stale", 1, 1)])
        finally:
            await admin.close()
        producer = make_producer(broker.bootstrap)
        await producer.start()
        try:
            for i in range(n):
                await producer.send_and_wait("stale", f"{tag}{i}".encode(), partition=0)
        finally:
            await producer.stop()

    await create_and_fill("old", 10)
    consumer = make_consumer(
        broker.bootstrap,
        "stale",
        group_id=new_id("stale"),
        session_timeout_ms=10_000,
        heartbeat_interval_ms=300,
    )
    await consumer.start()
    try:
        read = 0
        while read < 10:
            read += sum(len(r) for r in (await consumer.getmany(timeout_ms=1_000)).values())
        await asyncio.to_thread(broker.kill)
        await asyncio.to_thread(broker.start, apply=False)
        # the heartbeat finds the member unknown and drops the generation (aiokafka's state)
        await wait_for(
            lambda: _true(consumer._coordinator.generation < 0), "the reset", timeout_s=20
        )
        commit = asyncio.create_task(consumer.commit({tp: 10}))
        await asyncio.sleep(1.0)
        await create_and_fill("new", 3)
        with pytest.raises(CommitFailedError):
            await asyncio.wait_for(commit, 20)
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(values) < 3 and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            values += [r.value for records in batch.values() for r in records]
        assert values == [b"new0", b"new1", b"new2"]
    finally:
        await consumer.stop()
        broker.stop()


async def _true(condition: bool) -> bool | None:
    return True if condition else None


async def test_records_the_broker_lists_but_does_not_serve_never_hang_a_reader() -> None:
    """Tansu restarted empty takes a producer's records for a topic not created yet; once the
    topic is created it lists them and serves nothing from their partition for seconds. A
    reader (the spool drain looking for what a timed-out send delivered, the worker looking
    for its samples) gives up on them instead of waiting for good."""
    broker = Broker()
    await asyncio.to_thread(broker.start, apply=False)

    async def create() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic("limbo", 2, 1)])
        finally:
            await admin.close()

    await create()
    producer = make_producer(broker.bootstrap, request_timeout_ms=3_000, retry_backoff_ms=100)
    await producer.start()
    consumer = make_consumer(broker.bootstrap, request_timeout_ms=3_000)
    try:
        await producer.send_and_wait("limbo", b"before", partition=1)
        await asyncio.to_thread(broker.kill)
        await asyncio.to_thread(broker.start, apply=False)
        # the producer's metadata still has the topic: the new broker takes the record
        await asyncio.wait_for(producer.send_and_wait("limbo", b"limbo", partition=1), 10)
        await create()
        await consumer.start()
        parts = [TopicPartition("limbo", p) for p in (0, 1)]

        async def read() -> list[bytes]:
            return [r.value async for r in read_to_end(consumer, dict.fromkeys(parts, 0))]

        assert await asyncio.wait_for(read(), 15) in ([], [b"limbo"])
    finally:
        await consumer.stop()
        await producer.stop()
        broker.stop()
