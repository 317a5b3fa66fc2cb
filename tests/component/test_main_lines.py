"""Calls without a session id join the session whose main line they extend, on a real gateway."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import asyncpg
import httpx

from ..support.gateway import GatewayProcess, read_steps


def test_a_conversation_without_session_ids_stays_one_session(gateway: GatewayProcess) -> None:
    system = {"role": "system", "content": f"You are agent {uuid.uuid4().hex}."}

    def call(messages: list[dict]) -> tuple[dict, str]:
        r = httpx.post(
            gateway.base_url + "/v1/chat/completions",
            json={"model": "policy", "messages": messages, "max_tokens": 4},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"], r.headers["x-claw-step-id"]

    context = {"role": "user", "content": "<<context of this call only>>"}
    first = [system, {"role": "user", "content": "hello"}]
    reply1, step1 = call([*first, context])
    second = [*first, reply1, {"role": "user", "content": "and then?"}]
    reply2, step2 = call([*second, context])
    _, step3 = call([*second, reply2, {"role": "user", "content": "thanks"}])
    _, other = call([system, {"role": "user", "content": "a different conversation"}])
    steps = {str(s.step_id): s for s in read_steps(gateway.bootstrap)}
    sessions = [steps[s].session_id for s in (step1, step2, step3)]
    assert len(set(sessions)) == 1 and sessions[0].startswith("c-")
    assert [steps[s].turn_index for s in (step1, step2, step3)] == [0, 1, 2]
    assert steps[other].session_id != sessions[0]


def _heads_of(database: str, session_id: str, delete: bool = False) -> int:
    async def run() -> int:
        conn = await asyncpg.connect(database.replace("+asyncpg", ""))
        try:
            verb = "DELETE" if delete else "SELECT 1"
            status = await conn.execute(
                f"{verb} FROM session_heads WHERE session_id = $1", session_id
            )
            return int(status.split()[-1])
        finally:
            await conn.close()

    return asyncio.run(run())


def _until_heads(database: str, session_id: str) -> None:
    deadline = time.monotonic() + 20
    while not _heads_of(database, session_id):
        assert time.monotonic() < deadline, "the gateway never wrote the session's heads"
        time.sleep(0.1)


def test_the_next_call_joins_before_postgres_has_the_heads_and_on_another_replica(
    gateway: GatewayProcess, broker: str, database: str, tmp_path: Path
) -> None:
    """A client that calls again the moment it has the answer joins its session although the
    heads reach Postgres in the background (the doctor's two calls once went to two sessions on
    CI); another replica joins it through Postgres."""

    def call(base_url: str, messages: list[dict]) -> tuple[dict, str]:
        r = httpx.post(
            base_url + "/v1/chat/completions",
            json={"model": "policy", "messages": messages, "max_tokens": 4},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"], r.headers["x-claw-session-id"]

    first = [
        {"role": "system", "content": f"agent {uuid.uuid4().hex}"},
        {"role": "user", "content": "hi"},
    ]
    reply1, session = call(gateway.base_url, first)
    _until_heads(database, session)
    assert _heads_of(database, session, delete=True)  # as if the write had not landed yet
    second = [*first, reply1, {"role": "user", "content": "and?"}]
    reply2, joined = call(gateway.base_url, second)
    assert joined == session

    _until_heads(database, session)
    other = GatewayProcess(
        broker, database, gateway.args[gateway.args.index("--backends") + 1].split(","), tmp_path
    )
    try:
        _, on_other = call(other.base_url, [*second, reply2, {"role": "user", "content": "ok"}])
    finally:
        other.stop()
    assert on_other == session
