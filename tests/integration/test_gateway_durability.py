"""The gateway never loses an answered call: broker paused mid-traffic, gateway SIGKILLed."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
import uuid
from collections import defaultdict
from pathlib import Path

import httpx
import pytest

from ..support.gateway import OTHER, GatewayProcess, read_steps
from ..support.processes import free_port

pytestmark = pytest.mark.slow


async def traffic(
    base_url: str, sessions: list[str], seconds: float, answered: dict[str, list[str]]
) -> int:
    """Each session calls in turn, as an agent does; returns how many calls failed."""
    failures = 0

    async def one(session: str) -> None:
        nonlocal failures
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as c:
            stop_at = time.monotonic() + seconds
            while time.monotonic() < stop_at:
                try:
                    r = await c.post(
                        "/v1/chat/completions",
                        json={
                            "model": "policy",
                            "messages": OTHER,
                            "max_tokens": 4,
                            "stream": len(answered[session]) % 2 == 1,
                        },
                        headers={"X-Session-Id": session},
                    )
                    await r.aread()
                except httpx.HTTPError:
                    failures += 1
                    await asyncio.sleep(0.2)
                    continue
                if r.status_code != 200 or (
                    b"[DONE]" not in r.content
                    and r.headers.get("content-type", "").startswith("text/event-stream")
                ):
                    failures += 1
                    continue
                answered[session].append(r.headers["x-claw-step-id"])

    await asyncio.gather(*(one(s) for s in sessions))
    return failures


def wait_drained(gateway: GatewayProcess, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(gateway.base_url + "/healthz").json()["spooled"] == 0:
            return
        time.sleep(0.2)
    raise AssertionError("spool did not drain")


def assert_exactly_once_in_order(
    bootstrap: str, answered: dict[str, list[str]], *, in_flight: int = 0
) -> None:
    """Every answered call's Step is on the topic once, in the session's order. `in_flight`
    calls whose answer never reached the client (the gateway died) may be there too."""
    steps = read_steps(bootstrap, set(answered))
    on_topic: dict[str, list[str]] = defaultdict(list)
    for step in steps:
        on_topic[step.session_id].append(str(step.step_id))
    extra = 0
    for session, ids in answered.items():
        recorded = on_topic[session]
        assert len(recorded) == len(set(recorded)), f"{session}: a Step is on the topic twice"
        answered_order = [i for i in recorded if i in set(ids)]
        assert answered_order == ids, f"{session}: missing or out of order"
        extra += len(recorded) - len(ids)
    assert extra <= in_flight, f"{extra} Steps of calls nobody was answered"


# `bench/durability_bench.py` runs it many times beside CPU-burning processes
RUNS = int(os.environ.get("CLAW_DURABILITY_RUNS", "1"))


@pytest.mark.parametrize("run", range(RUNS))
def test_broker_paused_mid_traffic_loses_nothing(
    own_broker, database, tools_engine, tmp_path: Path, run: int
) -> None:
    bootstrap, broker = own_broker
    gateway = GatewayProcess(bootstrap, database, [tools_engine.base_url], tmp_path)
    sessions = [f"pause-{i}-{uuid.uuid4().hex[:6]}" for i in range(4)]
    answered: dict[str, list[str]] = defaultdict(list)
    try:

        async def scenario() -> int:
            run = asyncio.create_task(traffic(gateway.base_url, sessions, 9.0, answered))
            await asyncio.sleep(2.0)
            broker.send_signal(signal.SIGSTOP)
            await asyncio.sleep(3.0)
            spooled = (await asyncio.to_thread(httpx.get, gateway.base_url + "/healthz")).json()[
                "spooled"
            ]
            broker.send_signal(signal.SIGCONT)
            failures = await run
            assert spooled > 0, "the pause should have sent steps to the spool"
            return failures

        failures = asyncio.run(scenario())
        assert failures == 0
        wait_drained(gateway)
        assert sum(len(v) for v in answered.values()) > 20
        assert_exactly_once_in_order(bootstrap, answered)
    finally:
        gateway.stop()


def test_spool_survives_a_sigkilled_gateway(
    own_broker, database, tools_engine, tmp_path: Path
) -> None:
    bootstrap, broker = own_broker
    port = free_port()
    gateway = GatewayProcess(bootstrap, database, [tools_engine.base_url], tmp_path, port=port)
    sessions = [f"kill-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
    answered: dict[str, list[str]] = defaultdict(list)
    try:
        asyncio.run(traffic(gateway.base_url, sessions, 1.5, answered))
        broker.send_signal(signal.SIGSTOP)  # the next answers can only go to the spool
        asyncio.run(traffic(gateway.base_url, sessions, 3.0, answered))
        assert httpx.get(gateway.base_url + "/healthz").json()["spooled"] > 0
        gateway.kill()
        broker.send_signal(signal.SIGCONT)
        gateway.start()  # same port, same data dir: the spool drains first
        wait_drained(gateway)
        asyncio.run(traffic(gateway.base_url, sessions, 1.0, answered))
        assert_exactly_once_in_order(bootstrap, answered)
    finally:
        gateway.stop()


def test_gateway_killed_mid_traffic_keeps_every_completed_call(
    own_broker, database, tools_engine, tmp_path: Path
) -> None:
    bootstrap, _ = own_broker
    port = free_port()
    gateway = GatewayProcess(bootstrap, database, [tools_engine.base_url], tmp_path, port=port)
    sessions = [f"crash-{i}-{uuid.uuid4().hex[:6]}" for i in range(4)]
    answered: dict[str, list[str]] = defaultdict(list)
    try:

        async def scenario() -> None:
            run = asyncio.create_task(traffic(gateway.base_url, sessions, 4.0, answered))
            await asyncio.sleep(1.5)
            os.kill(gateway.proc.pid, signal.SIGKILL)
            await asyncio.sleep(0.5)
            await asyncio.to_thread(gateway.start)
            await run

        asyncio.run(scenario())
        wait_drained(gateway)
        assert sum(len(v) for v in answered.values()) > 10
        assert_exactly_once_in_order(bootstrap, answered, in_flight=len(sessions))
    finally:
        gateway.stop()


def worker_pids(gateway: GatewayProcess) -> list[int]:
    """The gateway's serving processes (uvicorn spawns them; a resource tracker is a child too)."""
    assert gateway.proc is not None
    children = Path(f"/proc/{gateway.proc.pid}/task/{gateway.proc.pid}/children").read_text()
    pids = []
    for pid in children.split():
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"spawn_main" in command and state != "Z":
            pids.append(int(pid))
    return pids


def spool_depth(gateway: GatewayProcess) -> float:
    metrics = httpx.get(gateway.base_url + "/metrics").text
    return float(re.search(r"^claw_gateway_spool_depth ([0-9.e+]+)$", metrics, re.M).group(1))


def test_processes_of_one_gateway_spool_apart_and_a_killed_ones_spool_drains(
    own_broker, database, tools_engine, tmp_path: Path
) -> None:
    """`--workers 2`: each process spools into its own slot; one killed with records in its
    slot is replaced by a process that drains them. Across processes the topic's order is
    not the call order, so the turn indexes must be."""
    bootstrap, broker = own_broker
    gateway = GatewayProcess(bootstrap, database, [tools_engine.base_url], tmp_path, workers=2)
    sessions = [f"procs-{i}-{uuid.uuid4().hex[:6]}" for i in range(4)]
    answered: dict[str, list[str]] = defaultdict(list)
    try:
        asyncio.run(traffic(gateway.base_url, sessions, 1.5, answered))
        broker.send_signal(signal.SIGSTOP)
        asyncio.run(traffic(gateway.base_url, sessions, 3.0, answered))
        slots = sorted(p.name for p in (tmp_path / "spool").glob("gateway-*/*") if p.is_dir())
        assert slots == ["0", "1"]
        assert spool_depth(gateway) > 0
        before = worker_pids(gateway)
        os.kill(before[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (now := worker_pids(gateway)) == before or len(now) < 2:
            assert time.monotonic() < deadline, "uvicorn did not replace the killed process"
            time.sleep(0.2)
        broker.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 60
        while spool_depth(gateway) > 0:
            assert time.monotonic() < deadline, "the spools did not drain"
            time.sleep(0.2)
        asyncio.run(traffic(gateway.base_url, sessions, 1.0, answered))
    finally:
        broker.send_signal(signal.SIGCONT)
        gateway.stop()
    steps = read_steps(bootstrap, set(answered))
    ids = [str(s.step_id) for s in steps]
    assert len(ids) == len(set(ids)), "a Step is on the topic twice"
    for session, calls in answered.items():
        mine = {str(s.step_id): s.turn_index for s in steps if s.session_id == session}
        assert set(calls) <= set(mine), f"{session}: an answered call's Step is missing"
        assert sorted(calls, key=mine.__getitem__) == calls, f"{session}: turn indexes disorder"
    assert sum(len(c) for c in answered.values()) > 10


def spool_oldest(gateway: GatewayProcess) -> float:
    metrics = httpx.get(gateway.base_url + "/metrics").text
    found = re.search(r"^claw_gateway_spool_oldest_seconds ([0-9.e+]+)$", metrics, re.M)
    assert found, metrics
    return float(found.group(1))


def test_a_spool_older_than_the_alarm_is_reported_until_it_drained(
    own_broker, database, tools_engine, tmp_path: Path
) -> None:
    """Broker stopped: the spool's oldest age rises past `spool_alarm_s`, /healthz is
    degraded saying why and the log says how many records wait; broker back: it drains,
    the age falls to 0 and /healthz is ok again."""
    bootstrap, broker = own_broker
    gateway = GatewayProcess(
        bootstrap,
        database,
        [tools_engine.base_url],
        tmp_path,
        env={"CLAW_GATEWAY__SPOOL_ALARM_S": "3"},
    )
    sessions = [f"alarm-{uuid.uuid4().hex[:6]}"]
    answered: dict[str, list[str]] = defaultdict(list)
    try:
        assert spool_oldest(gateway) == 0.0
        broker.send_signal(signal.SIGSTOP)
        try:
            assert asyncio.run(traffic(gateway.base_url, sessions, 1.5, answered)) == 0
            assert answered[sessions[0]], "calls are answered while the broker is stopped"
            deadline = time.monotonic() + 30
            while (age := spool_oldest(gateway)) <= 3.0:
                assert time.monotonic() < deadline, age
                time.sleep(0.5)
            health = httpx.get(gateway.base_url + "/healthz").json()
            assert health["status"] == "degraded", health
            assert any("spooled events wait for" in p for p in health["problems"]), health
            assert health["spool_oldest_s"] > 3.0
            log = (tmp_path / f"gateway-{gateway.port}.log").read_text()
            assert re.search(r"\d+ record\(s\) wait in the spool \(oldest \d+ s\)", log), log[
                -2000:
            ]
        finally:
            broker.send_signal(signal.SIGCONT)
        wait_drained(gateway)
        assert spool_oldest(gateway) == 0.0
        assert httpx.get(gateway.base_url + "/healthz").json()["status"] == "ok"
        assert_exactly_once_in_order(bootstrap, answered)
    finally:
        gateway.stop()
