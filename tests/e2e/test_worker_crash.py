"""A worker SIGKILLed mid-stream and restarted: no sample lost, none emitted twice."""

from __future__ import annotations

import asyncio
from collections import Counter

import asyncpg

from claw_stream.events import Sample, SessionEvent
from claw_stream.ids import derive_uuid7
from claw_stream.store.db import asyncpg_dsn
from claw_stream.worker.logic.samples import sample_id_of
from claw_stream.worker.logic.turns import turn_id_of

from ..support.worker import (
    JudgeStub,
    chat,
    events_on,
    new_id,
    private_worker,
    send,
    wait_for,
)

SESSIONS = 40


async def test_sigkill_mid_stream_loses_no_sample_and_emits_none_twice(
    broker, postgres, tmp_path_factory
) -> None:
    judge = JudgeStub()
    worker, topics, url = await private_worker(
        broker,
        postgres,
        tmp_path_factory.mktemp("crash-worker"),
        "crash",
        judge_url=judge.url,
        orphan_after_s=3,
    )
    sessions = [
        chat(new_id(f"c{i}"), ["Do it.", "thanks", "Thanks again."]) for i in range(SESSIONS)
    ]
    # turns 0 and 1 are answered with thanks (+1); the last turn has no next state
    expected = {
        sample_id_of(derive_uuid7(turn_id_of(s), "judgement"), "binary", topics.samples)
        for steps in sessions
        for s in steps[:2]
    }

    async def traffic() -> None:
        for steps in sessions:
            await asyncio.sleep(0.4)
            await send(broker, topics.steps, steps)
            await send(
                broker,
                topics.session_events,
                [SessionEvent(session_id=steps[0].session_id, kind="ended", n_steps=3)],
            )

    async def samples() -> list[Sample]:
        return await events_on(broker, topics.samples, Sample)

    try:
        # the worker has joined its group and answers before the traffic starts
        warm = chat(new_id("warm"), ["Do it.", "thanks"])
        await send(broker, topics.steps, warm)
        await send(
            broker,
            topics.session_events,
            [SessionEvent(session_id=warm[0].session_id, kind="ended", n_steps=2)],
        )
        await wait_for(lambda: _at_least(samples, 1), "the worker to answer", timeout_s=120)
        sending = asyncio.create_task(traffic())
        await wait_for(lambda: _at_least(samples, 7), "the first samples", timeout_s=90)
        worker.kill()
        killed_at = len(await samples()) - 1
        worker.start()
        await sending
        try:
            await wait_for(lambda: _at_least(samples, len(expected) + 1), "every sample", 180)
        except AssertionError as exc:
            on_topic = {s.sample_id for s in await samples()}
            missing = expected - on_topic
            conn = await asyncpg.connect(asyncpg_dsn(url))
            rows = await conn.fetch(
                "SELECT session_id, status, created_at, updated_at FROM samples"
                " WHERE sample_id = ANY($1::uuid[])",
                list(missing),
            )
            await conn.close()
            raise AssertionError(
                f"{exc}; {len(on_topic)} on topic, missing {[dict(r) for r in rows]},"
                f" killed at {killed_at}; pipeline state: {await _state(url)}"
            ) from None
        await asyncio.sleep(6)  # past orphan_after_s: a resend would show up now
        published = await samples()
        ids = Counter(s.sample_id for s in published if s.session_id != warm[0].session_id)
        assert set(ids) == expected
        assert [i for i, n in ids.items() if n > 1] == []
        assert 0 < killed_at < len(expected)
    finally:
        worker.stop()
        judge.stop()


async def _state(url: str) -> list[dict]:
    """The pipeline state of sessions that have fewer than two published samples."""
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await conn.fetch(
            "SELECT p.session_id, p.closed_at IS NOT NULL AS closed, p.assembled_at IS NOT NULL"
            " AS assembled, p.end_n_steps, (SELECT count(*) FROM step_payloads s WHERE"
            " s.session_id = p.session_id) AS steps, (SELECT count(*) FROM turns t WHERE"
            " t.session_id = p.session_id) AS turns, (SELECT count(*) FROM judgements j WHERE"
            " j.session_id = p.session_id) AS judged, (SELECT string_agg(status, ',') FROM samples x"
            " WHERE x.session_id = p.session_id) AS samples FROM pipeline_sessions p"
        )
        short = [dict(r) for r in rows if (r["samples"] or "").count("published") < 2]
        return [{"sessions": len(rows)}, *short]
    finally:
        await conn.close()


async def _at_least(read, n: int) -> bool:
    return len(await read()) >= n
