"""`claw-stream up` on a fresh data dir: ready in under 60 s, data survives, no process left behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import httpx
import psutil

from claw_stream.bus.topics import apply_topics
from claw_stream.store import migrate

from ..support.stack import Up


def _leftovers(data_dir: Path, ports: tuple[int, ...]) -> list[str]:
    """Processes that still mention the data dir or a port of the stack."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if str(data_dir) in cmd or any(
            f":{p}" in cmd or f"-p {p}" in cmd or f"--port {p}" in cmd for p in ports
        ):
            found.append(f"{proc.info['pid']}: {cmd}")
    return found


DOCTOR = [sys.executable, "-m", "claw_stream", "doctor"]


def test_up_is_ready_fast_keeps_data_and_leaves_nothing_behind(tmp_path: Path) -> None:
    data_dir = tmp_path / "claw"
    up = Up(data_dir)
    try:
        elapsed = up.wait_ready(120)
        assert elapsed < 120  # the 60 s target is for broker + Postgres + topics + migrations
        infra = float(up.infra_ready_s())
        assert infra < 60
        output = "".join(up.lines)
        for name in ("broker", "postgres", "topics", "migrations", "engine", "gateway", "trainer"):
            assert name in output
        for name in ("worker",):
            assert name in output
        assert "7 topics, 7 created" in output
        assert (data_dir / "admin_key").read_text().strip() in output
        assert (data_dir / "logs" / "broker.log").exists()
        assert (data_dir / "logs" / "postgres.log").exists()
        pids = up.service_pids()
        assert set(pids) == {"broker", "postgres", "engine", "gateway", "trainer", "worker"}
        models = httpx.get(f"http://127.0.0.1:{up.gateway_port}/v1/models").json()
        assert models["data"][0]["id"] == "smollm2-135m"  # through the gateway to the engine
        answer = httpx.post(
            f"http://127.0.0.1:{up.gateway_port}/v1/chat/completions",
            json={
                "model": "smollm2-135m",
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 5,
            },
            headers={"X-Session-Id": "up-test"},
            timeout=60,
        )
        assert answer.status_code == 200 and answer.headers["x-claw-step-id"]
        # the doctor finds nothing wrong; with the worker stopped, it names the worker
        doctor = subprocess.run(DOCTOR, env=up.env, capture_output=True, text=True, timeout=300)
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert "streamed call" in doctor.stdout and "fail" not in doctor.stdout
        os.kill(pids["worker"], signal.SIGSTOP)
        try:
            doctor = subprocess.run(
                [*DOCTOR, "--timeout", "2"], env=up.env, capture_output=True, text=True, timeout=300
            )
        finally:
            os.kill(pids["worker"], signal.SIGCONT)
        assert doctor.returncode == 1
        failed = [line for line in doctor.stdout.splitlines() if "│ fail" in line]
        assert len(failed) == 1, doctor.stdout
        (failed,) = failed
        assert failed.startswith("│ worker"), doctor.stdout
        url = f"postgresql+asyncpg://claw@127.0.0.1:{up.pg_port}/claw"
        assert asyncio.run(migrate.current(url)) == migrate.head_revision()

        async def insert() -> None:
            conn = await asyncpg.connect(f"postgresql://claw@127.0.0.1:{up.pg_port}/claw")
            await conn.execute("INSERT INTO sessions (session_id) VALUES ('survivor')")
            await conn.close()

        asyncio.run(insert())
    finally:
        code = up.stop(signal.SIGINT)
    assert code == 0, "".join(up.lines)
    assert "stopped" in "".join(up.lines)
    for pid in pids.values():
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert (
        _leftovers(
            data_dir,
            (
                up.broker_port,
                up.pg_port,
                up.engine_port,
                up.gateway_port,
                up.trainer_port,
                up.worker_port,
            ),
        )
        == []
    )
    assert not (data_dir / "run" / "up.json").exists()

    # Second start on the same data dir: no new cluster, the row is still there; SIGTERM stops it.
    again = Up(data_dir, "--no-engine", "--no-gateway", "--no-trainer", "--no-worker")
    try:
        again.wait_ready(60)

        async def fetch() -> list:
            conn = await asyncpg.connect(f"postgresql://claw@127.0.0.1:{again.pg_port}/claw")
            rows = await conn.fetch("SELECT session_id FROM sessions")
            await conn.close()
            return [r["session_id"] for r in rows]

        sessions = set(asyncio.run(fetch()))
        assert {"survivor", "up-test"} <= sessions  # both outlived the restart
        assert any(s.startswith("s-") for s in sessions)  # the quickstart's session key
        pids = again.service_pids()
    finally:
        code = again.stop(signal.SIGTERM)
    assert code == 0, "".join(again.lines)
    for pid in pids.values():
        assert not psutil.pid_exists(pid)
    assert _leftovers(data_dir, (again.broker_port, again.pg_port)) == []


def test_up_restarts_a_service_that_dies(tmp_path: Path) -> None:
    up = Up(tmp_path / "claw", "--no-engine", "--no-gateway", "--no-trainer", "--no-worker")
    try:
        up.wait_ready(60)
        broker_pid = up.service_pids()["broker"]
        os.kill(broker_pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and up.service_pids()["broker"] == broker_pid:
            time.sleep(0.2)
        assert up.service_pids()["broker"] != broker_pid, "".join(up.lines)
        assert "broker exited" in "".join(up.lines)
        # the new broker is memory-only: the supervisor re-applied the topics before announcing it
        reports = asyncio.run(apply_topics(f"127.0.0.1:{up.broker_port}"))
        assert [r.action for r in reports] == ["ok"] * len(reports)
    finally:
        assert up.stop(signal.SIGINT) == 0
    assert _leftovers(tmp_path / "claw", (up.broker_port, up.pg_port)) == []


def test_a_killed_supervisor_takes_its_services_with_it(tmp_path: Path) -> None:
    up = Up(tmp_path / "claw", "--no-engine", "--no-gateway", "--no-trainer", "--no-worker")
    up.wait_ready(60)
    pids = up.service_pids()
    up.proc.kill()
    up.proc.wait(timeout=10)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids.values()):
        time.sleep(0.2)
    assert not any(psutil.pid_exists(p) for p in pids.values())
    assert _leftovers(tmp_path / "claw", (up.broker_port, up.pg_port)) == []
