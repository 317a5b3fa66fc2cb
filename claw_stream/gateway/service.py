"""The gateway's parts and their lifecycle: session store, publisher, upstreams, auth, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
from collections.abc import Coroutine
from typing import Any

import httpx
from prometheus_client import multiprocess

from claw_stream.events import DeadLetter, Event, SessionEvent
from claw_stream.gateway.auth import Auth
from claw_stream.gateway.capture import encode_json
from claw_stream.gateway.main_lines import MainLines
from claw_stream.gateway.metrics import Metrics, SpoolDepth
from claw_stream.gateway.publisher import EventPublisher
from claw_stream.gateway.sessions import SessionStore
from claw_stream.gateway.upstreams import BackendPool, Upstream
from claw_stream.settings import Settings

log = logging.getLogger(__name__)
GC_THRESHOLD = 35_000


class Gateway:
    def __init__(self, settings: Settings):
        g = settings.gateway
        self.settings = settings
        self.topics = settings.topics
        self.metrics = Metrics()
        # health checks and /v1/models; the chat hot path goes through `Upstream` (aiohttp)
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(g.upstream_timeout_s, connect=2.0),
            limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
        )
        self.pool = BackendPool(g.backends, self.http, g.health_interval_s)
        errors = self.metrics.upstream_errors
        self.upstream = Upstream(
            self.pool, g.upstream_timeout_s, lambda backend: errors.labels(backend.url).inc()
        )
        self.sessions = SessionStore(settings.database_url, settings.resolved_admin_key())
        self.lines = (
            MainLines(lambda: self.sessions.pool, g.join_window_s) if g.join_by_prefix else None
        )
        self.auth = Auth(
            settings.resolved_admin_key(),
            g.client_key,
            self.sessions,
            strict_keys=g.strict_keys,
            lines=self.lines,
        )
        self.publisher = EventPublisher(
            settings.kafka_bootstrap,
            g.spool_dir or settings.data_dir / "spool" / f"gateway-{g.port}",
            timeout_s=g.publish_timeout_s,
            on_publish=self.metrics.publish.observe,
        )
        self.spool_depth = SpoolDepth(self.publisher.slot)
        self.metrics.registry.register(self.spool_depth)
        self._sweeper: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await self.upstream.start()
        await self.sessions.start()
        await self.publisher.start()
        with contextlib.suppress(Exception):  # the spool of an earlier run goes first
            await asyncio.wait_for(self.publisher.drain(), 10)
        await self.pool.start()
        self._sweeper = asyncio.create_task(self._sweep_idle())
        # A call allocates thousands of short-lived objects (token lists, parsed bodies) and
        # frees them by reference counting; the cyclic collector's frequent young-generation
        # passes over a large heap then cost more than the call itself. Objects alive after
        # start-up are exempt from collection, and young passes run 50 times less often.
        gc.freeze()
        gc.set_threshold(GC_THRESHOLD, 20, 20)

    async def stop(self) -> None:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            multiprocess.mark_process_dead(os.getpid())
        if self._sweeper:
            self._sweeper.cancel()
        await self.pool.stop()
        await self.publisher.stop()
        await self.sessions.stop()
        await self.http.aclose()
        await self.upstream.stop()

    async def _sweep_idle(self) -> None:
        idle = self.settings.gateway.session_idle_timeout_s
        while True:
            await asyncio.sleep(min(30.0, idle / 4))
            try:
                if self.lines is not None:
                    await self.lines.expire()
                for ended in await self.sessions.expire_idle(idle):
                    await self.emit(
                        SessionEvent(
                            session_id=ended.session_id,
                            kind="ended",
                            reason="idle_timeout",
                            n_steps=ended.n_steps,
                        )
                    )
            except Exception:
                log.exception("idle sweep failed")

    def keep(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """`work` as a task that runs to its end, whatever becomes of the call it serves."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def emit(self, event: Event) -> bool:
        key = getattr(event, "session_id", None) or "gateway"
        topic = self.topics.steps if event.id_field == "step_id" else self.topics.session_events
        return await self.publisher.publish(topic, key, event)

    async def dead_letter(self, key: str, payload: dict[str, Any], exc: Exception) -> None:
        letter = DeadLetter(
            source_topic=self.topics.steps,
            key=key,
            value=encode_json(payload, anything_as_text=True).decode(),
            error_type=type(exc).__name__,
            error=str(exc)[:4000],
            processor="gateway",
        )
        await self.publisher.publish(self.topics.dlq, key, letter)
