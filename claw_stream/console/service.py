"""The console's parts and their lifecycle: Postgres, the broker's lag (read in the background,
so a page never waits on the broker), the services' health probes, and the learning curve's
plot (drawn again only when something new was evaluated)."""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from claw_stream.bus.lag import LagMonitor, TopicLag, pipeline_stages
from claw_stream.evaluation.report import render
from claw_stream.evaluation.report.learning import build
from claw_stream.evaluation.report.reading import Scope, read
from claw_stream.settings import Settings
from claw_stream.store import models as m
from claw_stream.store.db import make_engine


@dataclass(frozen=True)
class Health:
    name: str
    url: str
    ok: bool
    said: str  # its answer's status, or the error


class Console:
    def __init__(self, settings: Settings, lag: LagMonitor | None = None):
        """`lag`: a monitor running already (the gateway's), else the console runs its own."""
        self.settings = settings
        self.admin_key = settings.resolved_admin_key()
        self.db: AsyncEngine = make_engine(settings.database_url)
        self._own_lag = lag is None
        self.lag = lag or LagMonitor(
            settings.kafka_bootstrap,
            pipeline_stages(
                settings.topics,
                settings.worker.app_id,
                settings.trainer.group_id,
                settings.samples_topic,
            ),
        )
        self.http = httpx.AsyncClient(timeout=10)
        self._plot: tuple[tuple[int, int], bytes] | None = None

    async def start(self) -> None:
        if self._own_lag:
            self.lag.start()

    async def stop(self) -> None:
        if self._own_lag:
            await self.lag.stop()
        await self.http.aclose()
        await self.db.dispose()

    def lags(self) -> list[TopicLag]:
        return self.lag.last

    def probes(self) -> list[tuple[str, str]]:
        """Each service's health URL, from the settings (what `claw-stream up` starts)."""
        s = self.settings
        found = [(f"engine {url}", f"{url.rstrip('/')}/health") for url in s.gateway.backends]
        found.append(("gateway", f"http://{s.gateway.host}:{s.gateway.port}/healthz"))
        evaluating = s.eval.on_ready or s.serving.policy == "gated"  # else `up` starts none
        for name, host, port in (
            ("worker", s.worker.metrics_host, s.worker.metrics_port or 9401),
            ("trainer", s.trainer.metrics_host, s.trainer.metrics_port),
            ("evaluator", s.eval.metrics_host, s.eval.metrics_port if evaluating else None),
        ):
            if port is not None:
                found.append((name, f"http://{host}:{port}/metrics"))
        return found

    async def health(self) -> list[Health]:
        async def probe(name: str, url: str) -> Health:
            try:
                r = await self.http.get(url, timeout=1.5)
            except httpx.HTTPError as exc:
                return Health(name, url, False, type(exc).__name__)
            return Health(name, url, r.status_code < 400, str(r.status_code))

        found = list(await asyncio.gather(*(probe(n, u) for n, u in self.probes())))
        try:
            async with self.db.connect() as conn:
                await conn.scalar(select(1))
            found.append(Health("postgres", "", True, "up"))
        except Exception as exc:  # any failure to reach it is "down", shown as such
            found.append(Health("postgres", "", False, type(exc).__name__))
        read = bool(self.lag.last)  # the lag is read from the broker every few seconds
        said = "up" if read else "its offsets were not read yet"
        found.append(Health("broker", self.settings.kafka_bootstrap, read, said))
        return found

    async def curve_png(self) -> bytes | None:
        """The learning report's plot (held-out curves, the judge's votes per version),
        drawn again only when versions or held-out scores changed."""
        policy = self.settings.policy_name
        async with self.db.connect() as conn:
            versions = await conn.scalar(
                select(func.count())
                .select_from(m.WeightVersion)
                .where(m.WeightVersion.policy == policy)
            )
            scores = await conn.scalar(
                select(func.count())
                .select_from(m.HeldOutResult)
                .where(m.HeldOutResult.policy == policy)
            )
        state = (int(versions or 0), int(scores or 0))
        if self._plot is not None and self._plot[0] == state:
            return self._plot[1]
        report = build(await read(self.settings.database_url, policy, Scope()))
        with tempfile.TemporaryDirectory() as folder:
            png = render.plot(report, Path(folder) / "curve.png").read_bytes()
        self._plot = (state, png)
        return png
