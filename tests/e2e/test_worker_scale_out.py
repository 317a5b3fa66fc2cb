"""Workers that scale out (issue 57): a second worker joins the consumer group under traffic, then
the first is SIGKILLed under traffic; every answered Step yields its turns and its samples exactly
once, and each session's turns stay in order."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import httpx
from prometheus_client.parser import text_string_to_metric_families

from claw_stream.bus.topics import specs_for
from claw_stream.events import Sample, SessionEvent, Step
from claw_stream.ids import derive_uuid7
from claw_stream.store.db import asyncpg_dsn
from claw_stream.worker.logic.samples import sample_id_of
from claw_stream.worker.logic.turns import turn_id_of

from ..support.processes import free_port
from ..support.worker import (
    JudgeStub,
    WorkerProcess,
    chat,
    events_on,
    new_id,
    private_worker,
    send,
    wait_for,
)

SESSIONS = 40
REPLIES = ["Do it.", "thanks", "Thanks again."]  # turns 0 and 1 are thanked; turn 2 has no next
JOINED_BY = 20  # the traffic waits here for the second worker to have taken partitions ...
KILLED_BY = 30  # ... and here for the first to be killed: both happen mid-traffic
AFTER_JOIN = 5  # sessions sent while both work


class Metered:
    """A worker with a metrics port: the partitions it holds, the records it handled."""

    def __init__(self, worker: WorkerProcess, port: int):
        self.worker, self.port = worker, port

    async def metric(self, family: str, check: bool = True, **labels: str) -> int:
        """A metric's value now (0 while the worker answers nothing yet); with `check`, fail
        with the worker's log when it died."""
        if check:
            self.worker.check()
        try:
            async with httpx.AsyncClient(timeout=2) as http:
                text = (await http.get(f"http://127.0.0.1:{self.port}/metrics")).text
        except httpx.HTTPError:
            return 0
        for found in text_string_to_metric_families(text):
            for sample in found.samples if found.name == family else []:
                if sample.name in (family, f"{family}_total") and labels.items() <= (
                    sample.labels.items()
                ):
                    return int(sample.value)
        return 0

    async def holds(self, topic: str, check: bool = True) -> int:
        """Partitions of `topic` the group has assigned to this worker now."""
        return await self.metric("claw_worker_partitions", check, topic=topic)

    async def handled(self, check: bool = True) -> int:
        """Steps and session events its stitcher handled so far."""
        return await self.metric("claw_worker_records", check, agent="stitch")


async def test_a_worker_joins_and_another_is_killed_mid_traffic_and_every_step_comes_out_once(
    broker, postgres, tmp_path_factory
) -> None:
    judge = JudgeStub()
    root: Path = tmp_path_factory.mktemp("scale-out")
    port = free_port()
    first_worker, topics, url = await private_worker(
        broker,
        postgres,
        root / "worker-1",
        "scale",
        judge_url=judge.url,
        orphan_after_s=3,
        metrics_port=port,
    )
    first = Metered(first_worker, port)
    second: Metered | None = None
    workers = [first_worker]
    sessions = [chat(new_id(f"s{i}"), REPLIES) for i in range(SESSIONS)]
    expected_samples = {
        sample_id_of(derive_uuid7(turn_id_of(s), "judgement"), "binary", topics.samples)
        for steps in sessions
        for s in steps[:2]
    }
    joined, killed = asyncio.Event(), asyncio.Event()
    sent: list[str] = []

    async def traffic() -> None:
        for i, steps in enumerate(sessions):
            if i == JOINED_BY:
                await joined.wait()
            if i == KILLED_BY:
                await killed.wait()
            await asyncio.sleep(0.4)
            await send(broker, topics.steps, steps)
            ended = SessionEvent(session_id=steps[0].session_id, kind="ended", n_steps=3)
            await send(broker, topics.session_events, [ended])
            sent.append(steps[0].session_id)

    async def samples() -> list[Sample]:
        return await events_on(broker, topics.samples, Sample)

    timeline: list[str] = []  # what happened when, shown with a failure
    started = asyncio.get_running_loop().time()

    async def mark(what: str) -> None:
        at = asyncio.get_running_loop().time() - started
        n = len(await samples())
        timeline.append(f"{at:5.1f}s {what}: {len(sent)} sessions sent, {n} samples out")

    def logs() -> str:
        return "\n".join(["", *timeline]) + "".join(
            f"\n--- {w.data_dir.name} log (its end)\n{w.log()}" for w in workers
        )

    async def waited(probe: Callable[[], Awaitable[bool]], what: str, timeout_s: float) -> None:
        """wait_for, failing with the timeline, what each worker handled and their logs."""
        try:
            await wait_for(probe, what, timeout_s)
        except AssertionError as exc:
            handled = [await m.handled(False) for m in (first, second) if m is not None]
            missing = expected_samples - {s.sample_id for s in await samples()}
            raise AssertionError(
                f"{exc}; steps handled by each worker {handled}; missing {len(missing)} "
                f"samples; {await _state(url)}{logs()}"
            ) from None

    sending: asyncio.Task[None] | None = None
    try:
        # the first worker has joined its group and answers before the traffic starts
        warm = chat(new_id("warm"), ["Do it.", "thanks"])
        await send(broker, topics.steps, warm)
        await send(
            broker,
            topics.session_events,
            [SessionEvent(session_id=warm[0].session_id, kind="ended", n_steps=2)],
        )
        await waited(lambda: _at_least(samples, 1), "the first worker to answer", 120)
        sending = asyncio.create_task(traffic())
        await waited(lambda: _at_least(samples, 7), "the first samples", 90)

        # a second worker of the same app id (one consumer group), topics and database joins
        second_port = free_port()
        await mark("second worker started")
        second_worker = first_worker.beside(root / "worker-2", metrics_port=second_port)
        workers.append(second_worker)
        second = Metered(second_worker, second_port)
        steps_partitions = next(p.partitions for p in specs_for(topics) if p.name == topics.steps)

        async def shared() -> bool:
            held = [await first.holds(topics.steps), await second.holds(topics.steps)]
            return 0 not in held and sum(held) == steps_partitions

        # the group has rebalanced: each holds some of claw.steps' partitions, none both
        await waited(shared, "the two workers to share the partitions", 120)
        joined.set()
        await mark("the two share the partitions")
        sessions_at_join = len(sent)

        async def sent_since_join() -> bool:
            return len(sent) >= sessions_at_join + AFTER_JOIN

        await waited(sent_since_join, "traffic beside both workers", 60)
        first_worker.kill()
        await mark("first worker killed")
        killed.set()
        sessions_at_kill, samples_at_kill = len(sent), len(await samples())
        await sending
        await mark("traffic sent")

        async def all_out() -> bool:
            second_worker.check()
            return len(await samples()) >= len(expected_samples) + 1

        await waited(all_out, "every sample", 180)
        await mark("every sample out")

        async def second_holds_all() -> bool:
            return await second.holds(topics.steps) == steps_partitions

        # the group dropped the dead member: its partitions went to the second
        await waited(second_holds_all, "the second to hold every partition", 60)
        await waited(lambda: _count_turns(url, sent), "every turn archived", 60)
        await asyncio.sleep(6)  # past orphan_after_s: a resend would show up now
        second_worker.check()
        try:
            await _exactly_once_in_order(
                url,
                sessions,
                expected_samples,
                [s for s in await samples() if s.session_id in sent],
            )
            # both joined and died mid-traffic: sessions were sent before, between and after
            assert 0 < sessions_at_join < sessions_at_kill < SESSIONS
            assert samples_at_kill < len(expected_samples) + 1
            assert await second.handled() > 0
        except AssertionError as exc:
            raise AssertionError(f"{exc}{logs()}") from None
        print("\n".join(timeline))  # with -s: how the run went
    finally:
        if sending is not None:
            sending.cancel()
        for worker in workers:
            worker.stop()
        judge.stop()


async def _exactly_once_in_order(
    url: str, sessions: list[list[Step]], expected: set[uuid.UUID], published: list[Sample]
) -> None:
    """Every expected sample on the topic once, its row published; every step's turn archived
    once, each session's turns in order."""
    ids = Counter(s.sample_id for s in published)
    assert [str(i) for i, n in ids.items() if n > 1] == [], "samples published twice"
    assert set(ids) == expected, f"missing {expected - set(ids)}, unexpected {set(ids) - expected}"
    sent = [steps[0].session_id for steps in sessions]
    turns = await _rows(
        url,
        "SELECT turn_id, session_id, step_id, turn_index, next_step_id FROM turns"
        " WHERE session_id = ANY($1::text[])",
        sent,
    )
    expected_turns = Counter(turn_id_of(s) for steps in sessions for s in steps)
    assert Counter(r["turn_id"] for r in turns) == expected_turns
    _in_order(sessions, turns)
    rows = await _rows(
        url,
        "SELECT x.sample_id, x.session_id, x.status, t.turn_index FROM samples x"
        " JOIN turns t USING (turn_id) WHERE x.session_id = ANY($1::text[])",
        sent,
    )
    published_rows = [r for r in rows if r["status"] == "published"]
    assert {r["sample_id"] for r in published_rows} == expected
    # the last turn, with no next state, is stored without a signal and never sent
    others = {(r["status"], r["turn_index"]) for r in rows if r["status"] != "published"}
    assert others <= {("no_signal", 2)}
    by_session: dict[str, list[int]] = {}
    for r in published_rows:
        by_session.setdefault(r["session_id"], []).append(r["turn_index"])
    assert {s: sorted(t) for s, t in by_session.items()} == {s: [0, 1] for s in sent}


def _in_order(sessions: list[list[Step]], turns: list[asyncpg.Record]) -> None:
    """Each session's turns are 0..n-1, each with the next step of its session as its next
    state (the stitcher saw the session's steps in order), the last with none."""
    by_session: dict[str, dict[int, asyncpg.Record]] = {}
    for r in turns:
        by_session.setdefault(r["session_id"], {})[r["turn_index"]] = r
    for steps in sessions:
        session = by_session.get(steps[0].session_id, {})
        assert sorted(session) == list(range(len(steps))), (steps[0].session_id, sorted(session))
        for k, step in enumerate(steps):
            following = steps[k + 1].step_id if k + 1 < len(steps) else None
            assert (session[k]["step_id"], session[k]["next_step_id"]) == (step.step_id, following)


async def _rows(url: str, query: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        return list(await conn.fetch(query, *args))
    finally:
        await conn.close()


async def _count_turns(url: str, sessions: list[str]) -> bool:
    rows = await _rows(url, "SELECT count(*) AS n FROM turns WHERE session_id = ANY($1)", sessions)
    return rows[0]["n"] >= len(sessions) * len(REPLIES)


async def _state(url: str) -> list[dict]:
    """Sessions of the traffic with fewer than two published samples, and where they are."""
    rows = await _rows(
        url,
        "SELECT p.session_id, p.closed_at IS NOT NULL AS closed, p.assembled_at IS NOT NULL"
        " AS assembled, (SELECT count(*) FROM turns t WHERE t.session_id = p.session_id) AS"
        " turns, (SELECT count(*) FROM judgements j WHERE j.session_id = p.session_id) AS"
        " judged, (SELECT string_agg(status, ',') FROM samples x WHERE x.session_id ="
        " p.session_id) AS samples FROM pipeline_sessions p",
    )
    short = [dict(r) for r in rows if (r["samples"] or "").count("published") < 2]
    return [{"sessions": len(rows)}, *short]


async def _at_least(read, n: int) -> bool:
    return len(await read()) >= n
