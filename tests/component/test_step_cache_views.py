"""The stitcher's view of a session is the same whether its steps come from memory or from
Postgres, on the real embedded PostgreSQL."""

from __future__ import annotations

from claw_stream.store import migrate
from claw_stream.store.db import make_engine
from claw_stream.worker.stages.step_cache import StepCache
from claw_stream.worker.state import archive, segments

from ..support.worker import chat


async def test_a_view_from_memory_equals_the_view_from_postgres(empty_database: str) -> None:
    await migrate.upgrade(empty_database)
    db = make_engine(empty_database)
    steps = chat("s-cache", ["Do the task.", "thanks", "one more"])
    archived = StepCache(max_bytes=1 << 20)
    try:
        async with db.begin() as conn:
            await archive.archive_steps(conn, steps, archived)  # held as archived
            for step, turn_type in zip(steps, ["main", "side", "main"], strict=True):
                segment, _ = await segments.place_step(conn, step) or (0, False)
                await segments.record_placement(conn, step, segment, turn_type, "test")
        assert len(archived) == 3
        async with db.connect() as conn:
            plain = await segments.session_view(conn, "s-cache")
            held = await segments.session_view(conn, "s-cache", archived)
            cold = StepCache(max_bytes=1 << 20)
            first = await segments.session_view(conn, "s-cache", cold)
            again = await segments.session_view(conn, "s-cache", cold)
        assert plain is not None and held is not None and first is not None and again is not None
        assert [s.turn_type for s in plain.steps] == ["main", "side", "main"]  # as placed
        for view in (held, first, again):
            assert view.steps == plain.steps
            assert view.segments == plain.segments and view.arrived_at == plain.arrived_at
        assert (archived.hits, archived.misses) == (3, 0)
        assert (cold.hits, cold.misses) == (3, 3)  # read once from Postgres, then from memory
        archived.drop_sessions(["s-cache"])  # a forgotten session: read from Postgres again
        async with db.connect() as conn:
            assert (await segments.session_view(conn, "s-cache", archived)) == plain
        assert archived.misses == 3
    finally:
        await db.dispose()
