"""The agent keeps working while Postgres restarts: calls of known sessions are served through
a database outage, what needs the database says so (503, Retry-After), and the bookkeeping
catches up once the database is back."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from claw_stream.agents.doctor import check_gateway
from claw_stream.embedded.postgres import EmbeddedPostgres
from claw_stream.store import migrate

from ..support.engine import ADMIN_KEY
from ..support.gateway import OTHER, GatewayProcess
from ..support.postgres import create_database, database_url
from ..support.processes import free_port
from ..support.service_logs import log_file, tail
from ..support.stack import Up


class Traffic:
    """Agents calling without pause, each in its session (by header or by session key)."""

    def __init__(self, base_url: str, callers: dict[str, dict[str, str]]):
        self.base_url = base_url
        self.callers = callers  # name -> the headers that name its session
        self.answered: dict[str, list[str]] = defaultdict(list)
        self.session_of: dict[str, str] = {}
        self.failed: list[str] = []
        self.stop = asyncio.Event()

    async def _one(self, name: str) -> None:
        async with httpx.AsyncClient(base_url=self.base_url, timeout=30) as client:
            while not self.stop.is_set():
                stream = len(self.answered[name]) % 2 == 1
                try:
                    r = await client.post(
                        "/v1/chat/completions",
                        json={
                            "model": "policy",
                            "messages": OTHER,
                            "max_tokens": 4,
                            "stream": stream,
                        },
                        headers=self.callers[name],
                    )
                    await r.aread()
                except httpx.HTTPError as exc:
                    self.failed.append(f"{name}: {exc!r}")
                    await asyncio.sleep(0.2)
                    continue
                if r.status_code != 200 or (stream and b"[DONE]" not in r.content):
                    self.failed.append(f"{name}: {r.status_code} {r.text[:300]}")
                    await asyncio.sleep(0.2)
                    continue
                self.answered[name].append(r.headers["x-claw-step-id"])
                self.session_of[name] = r.headers["x-claw-session-id"]
                await asyncio.sleep(0.05)

    async def run(self) -> None:
        await asyncio.gather(*(self._one(name) for name in self.callers))

    def count(self) -> int:
        return sum(len(ids) for ids in self.answered.values())

    async def until(self, n: int, what: str, timeout_s: float = 120.0) -> None:
        """Until `n` calls in all were answered (not so many seconds: see support/traffic.py)."""
        deadline = time.monotonic() + timeout_s
        while self.count() < n:
            assert time.monotonic() < deadline, f"{self.count()} of {n} answered ({what})"
            await asyncio.sleep(0.05)


async def _archived(dsn: str, sessions: list[str]) -> dict[str, list[tuple[int, str, str]]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT s.session_id, s.turn_index, s.step_id::text AS step_id,"
            " p.payload->>'created_at' AS created_at FROM steps s"
            " JOIN step_payloads p USING (step_id) WHERE s.session_id = ANY($1::text[])",
            sessions,
        )
    finally:
        await conn.close()
    out: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
    for r in rows:
        out[r["session_id"]].append((r["turn_index"], r["created_at"], r["step_id"]))
    return out


async def _counted(dsn: str, sessions: list[str]) -> dict[str, int]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT session_id, n_steps FROM sessions WHERE session_id = ANY($1::text[])", sessions
        )
    finally:
        await conn.close()
    return {r["session_id"]: r["n_steps"] for r in rows}


def _logs(data_dir: Path) -> str:
    return "\n".join(
        f"--- {path.name} ---\n{tail(path)}" for path in sorted((data_dir / "logs").glob("*.log"))
    )


def test_postgres_killed_under_traffic_fails_no_call_and_loses_nothing(
    tools_engine, tmp_path: Path
) -> None:
    data_dir = tmp_path / "claw"
    up = Up(
        data_dir,
        "--no-engine",
        "--no-trainer",
        CLAW_GATEWAY__BACKENDS=json.dumps([tools_engine.base_url]),
        CLAW_WORKER__REWARDS='[{"use": "reaction"}]',  # no judge: this test is about the archive
        CLAW_SKILLS__ENABLED="true",  # as a user runs it: each call looks up its skills
    )
    try:
        up.wait_ready(120)
        base = f"http://127.0.0.1:{up.gateway_port}"
        admin = {"Authorization": f"Bearer {(data_dir / 'admin_key').read_text().strip()}"}
        callers: dict[str, dict[str, str]] = {
            f"header-{k}": {"X-Session-Id": f"outage-{k}-{uuid.uuid4().hex[:6]}"} for k in range(2)
        }
        for k in range(2):
            started = httpx.post(base + "/rl/start_session", json={}, headers=admin, timeout=30)
            assert started.status_code == 200, started.text
            callers[f"key-{k}"] = {"Authorization": f"Bearer {started.json()['api_key']}"}
        traffic = Traffic(base, callers)

        async def scenario() -> dict[str, object]:
            running = asyncio.create_task(traffic.run())
            await traffic.until(12, "before the kill")
            pg_pid = up.service_pids()["postgres"]
            before_kill = traffic.count()
            # the supervisor waits while the database is away: an outage as long as a dozen
            # calls take (its own restart is ~3 s, a dozen calls' time on a loaded machine)
            os.kill(up.proc.pid, signal.SIGSTOP)
            try:
                os.kill(pg_pid, signal.SIGKILL)
                # the gateway says so while the database is away
                seen_down: dict[str, object] = {}
                deadline = time.monotonic() + 60
                async with httpx.AsyncClient(base_url=base, timeout=10) as c:
                    while time.monotonic() < deadline:
                        health = (await c.get("/health")).json()
                        if health.get("postgres") == "down":
                            seen_down = health
                            break
                        await asyncio.sleep(0.2)
                await traffic.until(before_kill + 12, "while Postgres is down")
            finally:
                os.kill(up.proc.pid, signal.SIGCONT)
            deadline = time.monotonic() + 120
            # the supervisor restarts it; the journal drains
            while time.monotonic() < deadline and up.service_pids()["postgres"] == pg_pid:
                await asyncio.sleep(0.2)
            async with httpx.AsyncClient(base_url=base, timeout=10) as c:
                while time.monotonic() < deadline:
                    health = (await c.get("/health")).json()
                    if health.get("postgres") == "up" and health.get("journal") == 0:
                        break
                    await asyncio.sleep(0.2)
            during = traffic.count() - before_kill
            await traffic.until(traffic.count() + 8, "after the restart")
            traffic.stop.set()
            await running
            return {"health": seen_down, "during": during, "last_health": health}

        seen = asyncio.run(scenario())
        logs = _logs(data_dir)
        assert traffic.failed == [], f"{traffic.failed[:5]}\n{logs}"
        assert seen["health"], f"/health never said Postgres was down\n{logs}"
        assert seen["last_health"]["postgres"] == "up", f"{seen}\n{logs}"  # type: ignore[index]
        assert int(seen["during"]) > 10, f"{seen}: calls were not served during the outage"  # type: ignore[call-overload]
        for service in ("gateway", "worker"):
            assert "Traceback" not in (data_dir / "logs" / f"{service}.log").read_text(), logs
        metrics = httpx.get(base + "/metrics").text
        without = [
            line
            for line in metrics.splitlines()
            if line.startswith("claw_gateway_calls_without_store_total")
        ]
        assert without and float(without[0].split()[-1]) > 0, metrics[-2000:]

        # every answered call archived exactly once, in the order the session made them
        dsn = f"postgresql://claw@127.0.0.1:{up.pg_port}/claw"
        sessions = [traffic.session_of[name] for name in callers]
        deadline = time.monotonic() + 120
        while True:
            archived = asyncio.run(_archived(dsn, sessions))
            if sum(map(len, archived.values())) >= traffic.count() or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        counted = asyncio.run(_counted(dsn, sessions))
        for name, ids in traffic.answered.items():
            session = traffic.session_of[name]
            rows = archived[session]
            assert len(rows) == len({r[2] for r in rows}), f"{name}: a Step archived twice"
            in_order = [step_id for _, _, step_id in sorted(rows)]
            assert in_order == ids, f"{name}: missing or out of order\n{logs}"
            # the turn counter caught up with the calls served without the database
            assert counted[session] == len(ids), f"{name}: {counted[session]} != {len(ids)}"
    finally:
        up.stop(signal.SIGINT)


OwnPostgres = tuple[EmbeddedPostgres, list[subprocess.Popen[bytes]], Callable[[], Any]]


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[OwnPostgres]:
    """A Postgres of this test's own, which it stops and starts again (`start`)."""
    pg = EmbeddedPostgres(tmp_path / "pg", "127.0.0.1", free_port(), "claw", "claw")
    pg.ensure_initialised()
    log = log_file("own_postgres", tmp_path).open("ab")

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            pg.command(), stdout=log, stderr=subprocess.STDOUT, **pg.popen_kwargs()
        )
        asyncio.run(pg.wait_ready(30))
        return proc

    procs = [start()]
    yield pg, procs, start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=20)
    log.close()


def test_postgres_down_for_a_minute(
    broker: str, tools_engine: Any, own_postgres: OwnPostgres, tmp_path: Path
) -> None:
    pg, procs, start = own_postgres
    url = database_url(pg, asyncio.run(create_database(pg, "outage")))
    asyncio.run(migrate.upgrade(url))
    gateway = GatewayProcess(broker, url, [tools_engine.base_url], tmp_path)
    try:
        base = gateway.base_url
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        started = httpx.post(base + "/rl/start_session", json={}, headers=admin, timeout=30)
        assert started.status_code == 200, started.text
        callers = {
            "header": {"X-Session-Id": f"minute-{uuid.uuid4().hex[:6]}"},
            "key": {"Authorization": f"Bearer {started.json()['api_key']}"},
        }
        traffic = Traffic(base, callers)

        async def scenario() -> dict[str, object]:
            running = asyncio.create_task(traffic.run())
            await traffic.until(4, "before the kill")
            procs[0].kill()
            procs[0].wait()
            down_at = time.monotonic()
            out: dict[str, object] = {}
            async with httpx.AsyncClient(base_url=base, timeout=10) as c:
                deadline = time.monotonic() + 30  # the gateway notices at its next use of it
                while (health := (await c.get("/health")).json())["postgres"] != "down":
                    if time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.2)
                out["health"] = health
                out["healthz"] = (await c.get("/healthz")).json()
                with httpx.Client(timeout=10) as doctor_client:  # what `claw-stream doctor` says
                    out["doctor"] = (await asyncio.to_thread(check_gateway, doctor_client, base))[0]
                r = await c.post("/rl/start_session", json={}, headers=admin)
                out["start"] = (r.status_code, dict(r.headers), r.json())
                unknown = await c.post(
                    "/v1/chat/completions",
                    json={"model": "policy", "messages": OTHER, "max_tokens": 4},
                    headers={"Authorization": "Bearer claw-sk-never-seen-before-key"},
                )
                out["unknown_key"] = (unknown.status_code, dict(unknown.headers), unknown.json())
                await asyncio.sleep(max(0.0, 60.0 - (time.monotonic() - down_at)))
                out["served_down"] = traffic.count()
            procs.append(await asyncio.to_thread(start))
            async with httpx.AsyncClient(base_url=base, timeout=10) as c:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    health = (await c.get("/health")).json()
                    if health["postgres"] == "up" and health["journal"] == 0:
                        break
                    await asyncio.sleep(0.2)
                out["health_after"] = health
            traffic.stop.set()
            await running
            return out

        seen = asyncio.run(scenario())
        log = gateway.log()
        assert traffic.failed == [], f"{traffic.failed[:5]}\n{log}"
        health = seen["health"]
        assert health["postgres"] == "down", health  # type: ignore[index]
        assert "Postgres" in " ".join(seen["healthz"]["problems"]), seen["healthz"]  # type: ignore[index]
        gateway_check = seen["doctor"][0]  # type: ignore[index]
        assert gateway_check.outcome == "warn", gateway_check
        assert "Postgres is unreachable" in gateway_check.detail, gateway_check
        status, headers, body = seen["start"]  # type: ignore[misc]
        assert status == 503 and "retry-after" in headers, (status, body)
        assert "database" in body["error"]["message"]
        status, headers, body = seen["unknown_key"]  # type: ignore[misc]
        assert status == 503 and "retry-after" in headers, (status, body)
        assert body["error"]["type"]  # the OpenAI error shape
        # both sessions were served through the minute
        assert all(len(ids) > 20 for ids in traffic.answered.values()), {
            k: len(v) for k, v in traffic.answered.items()
        }
        assert seen["health_after"]["postgres"] == "up", seen["health_after"]  # type: ignore[index]
        counted = asyncio.run(
            _counted(pg.dsn(url.rsplit("/", 1)[1]), list(traffic.session_of.values()))
        )
        for name, ids in traffic.answered.items():
            assert counted[traffic.session_of[name]] == len(ids), name
        assert "Traceback" not in log, log[-3000:]
    finally:
        gateway.stop()
