"""Consumer lag per stage, read from the real broker: it rises while the worker is stopped and
steps keep coming, and falls back to 0 once it runs again; `claw-stream stats` and the
gateway's /metrics show it."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from claw_stream.bus.lag import pipeline_stages, read_lag
from claw_stream.cli import main
from claw_stream.events import SessionEvent
from claw_stream.names import Topics

from ..support.gateway import GatewayProcess
from ..support.worker import (
    JudgeStub,
    WorkerProcess,
    chat,
    new_id,
    private_worker,
    send,
    topics_env,
    wait_for,
)


class LagEnv:
    def __init__(
        self, broker: str, topics: Topics, group: str, worker: WorkerProcess, gw: GatewayProcess
    ):
        self.broker, self.topics, self.group = broker, topics, group
        self.worker, self.gateway = worker, gw
        self.stages = pipeline_stages(topics, group, "claw-trainer")

    async def lag(self) -> dict[tuple[str, str], int]:
        return {(x.stage, x.topic): x.lag for x in await read_lag(self.broker, self.stages)}

    async def scraped(self) -> dict[tuple[str, str], int]:
        async with httpx.AsyncClient() as client:
            text = (await client.get(self.gateway.base_url + "/metrics")).text
        (family,) = (
            f for f in text_string_to_metric_families(text) if f.name == "claw_consumer_lag"
        )
        return {(s.labels["stage"], s.labels["topic"]): int(s.value) for s in family.samples}


@pytest.fixture(scope="module")
def env(broker: str, postgres: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    judge = JudgeStub(slow_s=20)
    data = tmp_path_factory.mktemp("lag")
    worker, topics, url = asyncio.run(
        private_worker(
            broker, postgres, data, "lag", judge_url=judge.url, judge_timeout_s=2, judge_retries=0
        )
    )
    group = worker.env["CLAW_WORKER__APP_ID"]
    gw = GatewayProcess(
        broker,
        url,
        [judge.url.removesuffix("/v1")],
        data,
        env={
            **topics_env(topics),
            "CLAW_WORKER__APP_ID": group,
            "CLAW_GATEWAY__LAG_EVERY_S": "0.5",
        },
    )
    yield LagEnv(broker, topics, group, worker, gw)
    gw.stop()
    worker.stop()
    judge.stop()


async def test_lag_rises_while_the_worker_is_stopped_and_falls_when_it_resumes(
    env: LagEnv,
) -> None:
    t = env.topics
    worker_lag = [("worker", t.steps), ("worker", t.session_events), ("judge", t.turns)]

    async def caught_up() -> bool:
        env.worker.check()
        lag = await env.lag()
        return all(lag[k] == 0 for k in worker_lag) and lag[("trainer", t.samples)] >= 1

    # a judged conversation: the worker consumes it all; no trainer runs, so its sample waits
    sid = new_id("lag")
    await send(env.broker, t.steps, list(chat(sid, ["Name a colour.", "Perfect, thanks!"])))
    await send(
        env.broker, t.session_events, [SessionEvent(session_id=sid, kind="ended", n_steps=2)]
    )
    await wait_for(caught_up, "the worker to consume everything", timeout_s=90)

    env.worker.stop()
    waiting = chat(new_id("lag"), ["one", "two", "three", "four", "five"])
    for step in waiting:  # one batch each: the broker's end offsets count every record
        await send(env.broker, t.steps, [step])
    lag = await env.lag()
    assert lag[("worker", t.steps)] >= len(waiting)

    async def scraped_behind() -> bool:
        return (await env.scraped()).get(("worker", t.steps), 0) >= len(waiting)

    await wait_for(scraped_behind, "the gateway's gauge to show the lag", timeout_s=20)
    result = await asyncio.to_thread(
        CliRunner().invoke,
        main,
        ["stats", "--database-url", env.worker.env["CLAW_DATABASE_URL"], "--kafka", env.broker],
        env={**topics_env(t), "CLAW_WORKER__APP_ID": env.group},
    )
    assert result.exit_code == 0, result.output
    assert "consumer lag" in result.output
    line = next(row for row in result.output.splitlines() if t.steps in row)
    assert str(lag[("worker", t.steps)]) in line.split()

    env.worker.start()

    async def resumed() -> bool:
        env.worker.check()
        lag = await env.lag()
        return all(lag[k] == 0 for k in worker_lag)

    await wait_for(resumed, "the worker to catch up", timeout_s=120)

    async def scraped_caught_up() -> bool:
        scraped = await env.scraped()
        return all(scraped.get(k) == 0 for k in worker_lag)

    await wait_for(scraped_caught_up, "the gateway's gauge to fall to 0", timeout_s=20)
