"""The console with 100,000 sessions in the store: server time of its pages.

Seeds an embedded Postgres (migrated as `claw-stream up` does) with `--sessions` sessions of
three main steps and turns each, two judged and two sampled turns per session (a third of the
samples trained, one session in 50 switched off, keys shared by 20 sessions each), then asks
the console (in this process, through its ASGI app: no network, no broker) for pages of 50:
the first page, a page 1,000 deep, filters by key, by outcome and by id, one session, a session
of 500 turns with OpenClaw-sized prompts (the first and last page of its turns), the versions.
Prints p50 and p95 of the server time per page (the query and the rendering); the target is a
page of 50 sessions in under 200 ms.

Run: python bench/console_bench.py [--sessions 100000] [--repeat 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from claw_stream.console.app import create_app  # noqa: E402
from claw_stream.embedded.postgres import EmbeddedPostgres  # noqa: E402
from claw_stream.settings import Settings  # noqa: E402
from claw_stream.store import migrate  # noqa: E402
from claw_stream.store.consent import hash_key  # noqa: E402
from tests.support.processes import free_port  # noqa: E402

ADMIN = "bench-admin-key"

SEED = [
    # sessions: one key per 20 sessions (the key of session i is "key-{i / 20}")
    """
    INSERT INTO sessions (session_id, convention, key_hash, owner_key_hash, status, started_at,
                          last_seen_at, n_steps, train)
    SELECT 's-' || lpad(i::text, 7, '0'), 'api_key', NULL,
           encode(sha256(('key-' || (i / 20))::bytea), 'hex'), 'active',
           now() - make_interval(secs => i * 10), now() - make_interval(secs => i * 10 - 60),
           3, i % 50 <> 0
    FROM generate_series(1, :n) AS i
    """,
    """
    INSERT INTO steps (step_id, session_id, turn_type, turn_index, model, engine, weight_version,
                       prompt_tokens, completion_tokens, latency_ms, train, created_at)
    SELECT gen_random_uuid(), s.session_id, 'main', k, 'policy', 'e', 0, 100, 20, 50, true,
           s.started_at + make_interval(secs => k * 20)
    FROM sessions s, generate_series(0, 2) AS k
    """,
    """
    INSERT INTO turns (turn_id, session_id, step_id, turn_index, has_next_state, closed_reason,
                       created_at)
    SELECT gen_random_uuid(), session_id, step_id, turn_index, turn_index < 2, 'next_step',
           created_at
    FROM steps
    """,
    """
    INSERT INTO judgements (judgement_id, turn_id, session_id, step_id, judge_model, prm_score,
                            prm_votes, created_at)
    SELECT gen_random_uuid(), turn_id, session_id, step_id, 'smollm2-135m', 1, '[1]', created_at
    FROM turns WHERE turn_index < 2
    """,
    """
    INSERT INTO samples (sample_id, topic, session_id, step_id, turn_id, method, reward,
                         reward_source, weight_version, released_at_version, n_prompt_tokens,
                         n_response_tokens, trained_in_step, status, created_at, updated_at)
    SELECT gen_random_uuid(), 'claw.samples', session_id, step_id, turn_id, 'binary',
           CASE WHEN turn_index = 0 THEN 1.0 ELSE -1.0 END, 'feedback', 0, 0, 100, 20,
           CASE WHEN hashtext(session_id) % 3 = 0 THEN 1 END, 'published', created_at, created_at
    FROM turns WHERE turn_index < 2
    """,
    # one long session as an agent makes them: LONG_TURNS turns, each step's payload carrying
    # the conversation so far under a 48 KB system prompt (OpenClaw's)
    """
    INSERT INTO sessions (session_id, convention, owner_key_hash, status, started_at,
                          last_seen_at, n_steps, train)
    VALUES ('s-long', 'header', encode(sha256('key-long'::bytea), 'hex'), 'active',
            now() - interval '1 day', now(), :turns, true)
    """,
    """
    INSERT INTO steps (step_id, session_id, turn_type, turn_index, model, engine, weight_version,
                       prompt_tokens, completion_tokens, latency_ms, train, created_at)
    SELECT gen_random_uuid(), 's-long', 'main', k, 'policy', 'e', 0, 12000, 20, 50, true,
           now() - interval '1 day' + make_interval(secs => k * 20)
    FROM generate_series(0, :turns - 1) AS k
    """,
    """
    INSERT INTO step_payloads (step_id, session_id, payload, created_at)
    SELECT step_id, session_id, jsonb_build_object(
             'request', jsonb_build_object('messages',
               jsonb_build_array(jsonb_build_object('role', 'system',
                                                    'content', repeat('You are OpenClaw. ', 2700)))
               || (SELECT coalesce(jsonb_agg(jsonb_build_object(
                     'role', CASE WHEN i % 2 = 0 THEN 'user' ELSE 'assistant' END,
                     'content', 'message ' || i)), '[]'::jsonb)
                   FROM generate_series(0, 2 * turn_index) AS i)),
             'response', jsonb_build_object('message',
               jsonb_build_object('role', 'assistant', 'content', 'answer ' || turn_index))),
           created_at
    FROM steps WHERE session_id = 's-long'
    """,
    """
    INSERT INTO turns (turn_id, session_id, step_id, turn_index, has_next_state, closed_reason,
                       created_at, next_step_id)
    SELECT gen_random_uuid(), session_id, step_id, turn_index, true, 'next_step', created_at,
           lead(step_id) OVER (ORDER BY turn_index)
    FROM steps WHERE session_id = 's-long'
    """,
    "ANALYZE",
]
LONG_TURNS = 500


async def seed(url: str, n: int, console: Console) -> None:
    from sqlalchemy import text

    from claw_stream.store.db import make_engine

    engine = make_engine(url)
    try:
        with Progress(console=console) as bars:
            task = bars.add_task(f"seeding {n:,} sessions", total=len(SEED))
            values = {"n": n, "turns": LONG_TURNS}
            async with engine.begin() as conn:
                for statement in SEED:
                    await conn.execute(
                        text(statement), {k: v for k, v in values.items() if f":{k}" in statement}
                    )
                    bars.advance(task)
    finally:
        await engine.dispose()


async def measure(url: str, n: int, repeat: int) -> list[tuple[str, list[float], float]]:
    settings = Settings(database_url=url, admin_key=ADMIN, kafka_bootstrap="127.0.0.1:1")
    app = create_app(settings)
    app.state.console.db.pool  # noqa: B018 (the pool is made on first use)
    key_hash = hash_key("key-7")
    last_page = (LONG_TURNS - 1) // settings.console.turns_per_page
    pages = {
        "sessions, first page": "/console/sessions",
        "sessions, page 1,000": "/console/sessions?page=1000",
        "sessions of a key (the key)": "/console/sessions?key=key-7",
        "sessions of a key (its hash)": f"/console/sessions?key={key_hash[:12]}",
        "sessions trained": "/console/sessions?outcome=trained",
        "sessions switched off": "/console/sessions?outcome=off",
        "sessions since 2h": "/console/sessions?since=2h",
        "sessions whose id holds 12345": "/console/sessions?q=12345",
        "one session": f"/console/sessions/s-{n // 2:07d}",
        f"a session of {LONG_TURNS} turns (48 KB prompts)": "/console/sessions/s-long",
        "the same, its last page": f"/console/sessions/s-long?page={last_page}",
        "versions": "/console/versions",
    }
    out = []
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://console") as http:
        for name, path in pages.items():
            times = []
            rows = 0.0
            for i in range(repeat + 2):
                began = time.perf_counter()
                r = await http.get(path, headers=headers)
                took = (time.perf_counter() - began) * 1000
                assert r.status_code == 200, (path, r.status_code, r.text[:300])
                if i >= 2:  # two to warm the pool and the caches
                    times.append(took)
                rows = r.text.count("<tr>") + r.text.count("<tr ")
            out.append((name, times, rows))
    await app.state.console.db.dispose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    console = Console(width=120)
    with tempfile.TemporaryDirectory(prefix="console-bench-") as tmp:
        pg = EmbeddedPostgres(Path(tmp) / "pg", "127.0.0.1", free_port(), "claw", "claw")
        pg.ensure_initialised()
        import subprocess

        proc = subprocess.Popen(
            pg.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **pg.popen_kwargs()
        )
        try:

            async def run() -> list[tuple[str, list[float], float]]:
                await pg.wait_ready()
                await pg.ensure_database()
                await migrate.upgrade(pg.url)
                began = time.perf_counter()
                await seed(pg.url, args.sessions, console)
                console.print(f"seeded in {time.perf_counter() - began:.0f}s")
                return await measure(pg.url, args.sessions, args.repeat)

            results = asyncio.run(run())
        finally:
            proc.terminate()
            proc.wait()
    table = Table(
        "page",
        "rows shown",
        "p50 ms",
        "p95 ms",
        title=f"console server time, {args.sessions:,} sessions, {args.repeat} requests each",
    )
    for name, times, rows in results:
        p95 = statistics.quantiles(times, n=20)[-1] if len(times) > 1 else times[0]
        table.add_row(name, f"{rows:.0f}", f"{statistics.median(times):.1f}", f"{p95:.1f}")
    console.print(table)


if __name__ == "__main__":
    main()
