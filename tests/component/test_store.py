"""Migrations on the real embedded PostgreSQL."""

from __future__ import annotations

import uuid

import asyncpg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from click.testing import CliRunner
from sqlalchemy import select

from claw_stream.cli import main
from claw_stream.ids import uuid7
from claw_stream.store import migrate
from claw_stream.store.db import asyncpg_dsn, make_engine, make_sessionmaker
from claw_stream.store.models import Base, Session, StepPayload, WeightVersion

TABLES = {
    "sessions",
    "steps",
    "step_payloads",
    "session_events",
    "turns",
    "judgements",
    "samples",
    "weight_versions",
    "training_steps",
    "pipeline_sessions",
}


async def test_upgrade_an_empty_database(empty_database: str) -> None:
    assert await migrate.current(empty_database) is None
    await migrate.upgrade(empty_database)
    assert await migrate.current(empty_database) == migrate.head_revision()
    conn = await asyncpg.connect(asyncpg_dsn(empty_database))
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    finally:
        await conn.close()
    assert {r["tablename"] for r in rows} >= TABLES
    await migrate.upgrade(empty_database)  # a second upgrade is a no-op
    assert await migrate.current(empty_database) == migrate.head_revision()


async def test_migrations_match_the_models(empty_database: str) -> None:
    await migrate.upgrade(empty_database)
    engine = make_engine(empty_database)
    try:
        async with engine.connect() as conn:
            diff = await conn.run_sync(
                lambda sync: compare_metadata(
                    MigrationContext.configure(sync, opts={"compare_type": True}), Base.metadata
                )
            )
    finally:
        await engine.dispose()
    assert diff == [], f"models and migrations differ; add a revision: {diff}"


async def test_rows_round_trip(empty_database: str) -> None:
    await migrate.upgrade(empty_database)
    engine = make_engine(empty_database)
    sessions = make_sessionmaker(engine)
    step_id = uuid7()
    try:
        async with sessions.begin() as db:
            db.add(Session(session_id="s1", convention="header"))
            db.add(StepPayload(step_id=step_id, session_id="s1", payload={"messages": [1, 2]}))
            db.add(WeightVersion(policy="policy", version=1, status="ready", kind="full"))
        async with sessions() as db:
            payload = (await db.execute(select(StepPayload))).scalar_one()
            session = await db.get(Session, "s1")
        assert payload.step_id == step_id and payload.payload == {"messages": [1, 2]}
        assert session is not None and session.status == "active" and session.started_at is not None
    finally:
        await engine.dispose()


def test_cli_db_upgrade_and_current(empty_database: str) -> None:
    runner = CliRunner()
    before = runner.invoke(main, ["db", "current", "--database-url", empty_database])
    assert before.exit_code == 0 and "current: (empty)" in before.output
    up = runner.invoke(main, ["db", "upgrade", "--database-url", empty_database])
    assert up.exit_code == 0, up.output
    after = runner.invoke(main, ["db", "current", "--database-url", empty_database])
    head = migrate.head_revision()
    assert f"current: {head}" in after.output and f"head: {head}" in after.output


def test_cli_db_against_missing_database_is_readable(postgres) -> None:
    url = postgres.url.rsplit("/", 1)[0] + f"/missing_{uuid.uuid4().hex[:6]}"
    result = CliRunner().invoke(main, ["db", "current", "--database-url", url])
    assert result.exit_code == 1
    assert "does not exist" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("table", sorted(TABLES))
def test_every_table_has_a_model(table: str) -> None:
    assert table in Base.metadata.tables


async def test_the_release_queries_take_an_empty_list_of_sessions(empty_database: str) -> None:
    """A release pass for late episode rewards alone once ran with no ready session: the
    session filter was in the SQL and its parameter was not (`A value is required for bind
    parameter 'sessions'`, a traceback in the worker's log during test_tasks_loop.py)."""
    from claw_stream.worker.state import outbox

    await migrate.upgrade(empty_database)
    engine = make_engine(empty_database)
    try:
        async with engine.begin() as conn:
            for sessions in ([], None, ["s-none"]):
                assert await outbox.due_judgements(conn, sessions, 0.0) == []
                late = [("s-none", 0)]
                assert await outbox.segments_to_assemble(conn, sessions, late) == []
    finally:
        await engine.dispose()
