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

from ..support.gateway import GatewayProcess, read_steps
from ..support.processes import free_port
from ..support.traffic import Traffic, calls


def health(gateway: GatewayProcess) -> dict:
    return httpx.get(gateway.base_url + "/healthz").json()


async def until(condition, what: str, timeout_s: float = 60.0) -> None:
    """Wait (off the event loop's thread: the calls go on) until `condition()` holds."""
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(condition):
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        await asyncio.sleep(0.1)


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
            traffic = Traffic(gateway.base_url, sessions, answered).start()
            try:
                await traffic.until(8, "before the pause")
                broker.send_signal(signal.SIGSTOP)
                try:
                    await until(lambda: health(gateway)["spooled"] > 0, "a Step in the spool")
                    await traffic.more(8, "while the broker is paused")
                finally:
                    broker.send_signal(signal.SIGCONT)
                await traffic.more(8, "after the pause")
            finally:
                failures = await traffic.stop()
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
        asyncio.run(calls(gateway.base_url, sessions, 6, answered, "before the pause"))
        broker.send_signal(signal.SIGSTOP)  # the next answers can only go to the spool
        asyncio.run(calls(gateway.base_url, sessions, 6, answered, "while the broker is paused"))
        assert health(gateway)["spooled"] > 0
        gateway.kill()
        broker.send_signal(signal.SIGCONT)
        gateway.start()  # same port, same data dir: the spool drains first
        wait_drained(gateway)
        asyncio.run(calls(gateway.base_url, sessions, 3, answered, "after the restart"))
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
            traffic = Traffic(gateway.base_url, sessions, answered).start()
            try:
                await traffic.until(6, "before the kill")
                assert gateway.proc is not None
                os.kill(gateway.proc.pid, signal.SIGKILL)
                await asyncio.to_thread(gateway.start)  # waits until it is healthy again
                await traffic.more(6, "after the restart")
            finally:
                await traffic.stop()

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

        def slots() -> list[str]:
            return sorted(p.name for p in (tmp_path / "spool").glob("gateway-*/*") if p.is_dir())

        async def pause() -> None:
            traffic = Traffic(gateway.base_url, sessions, answered).start()
            try:
                await traffic.until(4, "before the pause")
                broker.send_signal(signal.SIGSTOP)
                await traffic.more(8, "while the broker is paused")
                # each process spools into a slot of its own
                await until(lambda: slots() == ["0", "1"], "a spool slot in each process")
            finally:
                await traffic.stop()

        asyncio.run(pause())
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
        asyncio.run(calls(gateway.base_url, sessions, 2, answered, "after the drain"))
    finally:
        broker.send_signal(signal.SIGCONT)
        gateway.stop()
    steps = read_steps(bootstrap, set(answered))
    ids = [str(s.step_id) for s in steps]
    assert len(ids) == len(set(ids)), "a Step is on the topic twice"
    for session, made in answered.items():
        mine = {str(s.step_id): s.turn_index for s in steps if s.session_id == session}
        assert set(made) <= set(mine), f"{session}: an answered call's Step is missing"
        assert sorted(made, key=mine.__getitem__) == made, f"{session}: turn indexes disorder"
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
            assert asyncio.run(calls(gateway.base_url, sessions, 3, answered, "paused")) == 0
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
