"""The gateway's parts and their lifecycle: session store, publisher, upstreams, auth, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
from collections.abc import Callable, Collection, Coroutine
from datetime import datetime
from typing import Any

import httpx
from prometheus_client import multiprocess
from sqlalchemy.ext.asyncio import AsyncEngine

from claw_stream.bus.guard import TopicGuard
from claw_stream.bus.kafka import make_producer
from claw_stream.bus.lag import LagMonitor, pipeline_stages
from claw_stream.bus.topics import specs_for
from claw_stream.events import DeadLetter, Event, SessionEvent
from claw_stream.gateway.background import Background
from claw_stream.gateway.capture import encode_json
from claw_stream.gateway.delivery.archive_check import ArchiveCheck, ArchiveTable
from claw_stream.gateway.delivery.publisher import EventPublisher
from claw_stream.gateway.metrics import ConsumerLag, GatewayMetrics, SpoolDepth, count_redactions
from claw_stream.gateway.redaction import RedactionError, Redactor
from claw_stream.gateway.sessions.auth import Auth
from claw_stream.gateway.sessions.main_lines import MainLines
from claw_stream.gateway.sessions.outage import quiet_reconnects
from claw_stream.gateway.sessions.store import SessionStore
from claw_stream.gateway.skills import SkillInjector
from claw_stream.gateway.upstreams import BackendPool, Upstream
from claw_stream.settings import Settings
from claw_stream.skills.scope import user_scope
from claw_stream.store import consent
from claw_stream.store import skills as skill_store
from claw_stream.store.db import make_engine
from claw_stream.versions.push import unload_everywhere

log = logging.getLogger(__name__)
GC_THRESHOLD = 35_000


class Gateway:
    def __init__(self, settings: Settings):
        g = settings.gateway
        self.settings = settings
        self.topics = settings.topics
        self.metrics = GatewayMetrics()
        r = g.redaction
        self.redactor = (
            Redactor(
                r.patterns,
                r.redactors,
                mask_prompts=r.prompt_secrets == "mask",
                cache_chars=int(r.cache_mb * 1_000_000),
                on_hits=count_redactions(self.metrics.redactions),
            )
            if r.enabled
            else None
        )
        # health checks and /v1/models; the chat hot path goes through `Upstream` (aiohttp)
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(g.upstream_timeout_s, connect=2.0),
            limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
        )
        self.pool = BackendPool(
            g.backends,
            self.http,
            g.health_interval_s,
            hosted=g.backend_kind == "hosted",
            api_key=g.backend_api_key,
        )
        errors = self.metrics.upstream_errors
        self.upstream = Upstream(
            self.pool, g.upstream_timeout_s, lambda backend: errors.labels(backend.url).inc()
        )
        self.sessions = SessionStore(settings.database_url, settings.resolved_admin_key())
        self.lines = (
            MainLines(lambda: self.sessions.pool, g.join_window_s, outage=self.sessions.outage)
            if g.join_by_prefix
            else None
        )
        self.auth = Auth(
            settings.resolved_admin_key(),
            g.client_key,
            self.sessions,
            strict_keys=g.strict_keys,
            lines=self.lines,
            untrained_keys=g.untrained_keys,
            tenants=settings.tenants,
            policy=settings.policy_name,
        )
        self.skills = SkillInjector(
            lambda: self.sessions.pool, settings.skills, self.sessions.outage
        )
        self.guard = TopicGuard(settings.kafka_bootstrap, specs_for(settings.topics))
        t = settings.topics
        # the worker archives these (by id) before anything else: the end of their road
        archived = {
            t.steps: ArchiveTable("steps", "step_id"),
            t.session_events: ArchiveTable("session_events", "event_id"),
        }
        self.publisher = EventPublisher(
            settings.kafka_bootstrap,
            g.spool_dir or settings.data_dir / "spool" / f"gateway-{g.port}",
            timeout_s=g.publish_timeout_s,
            on_publish=self.metrics.publish.observe,
            guard=self.guard,
            confirm_topics=frozenset(archived) if g.archive_check else frozenset(),
        )
        self.archive_check = (
            ArchiveCheck(
                self.publisher,
                lambda: self.sessions.pool,
                archived,
                settings.worker.app_id,
                resend_after_s=g.resend_after_s,
                on_resend=self.metrics.resent.inc,
            )
            if g.archive_check
            else None
        )
        self.spool_depth = SpoolDepth(self.publisher.slot, self.guard, self.archive_check)
        self.metrics.registry.register(self.spool_depth)
        self.lag = LagMonitor(
            settings.kafka_bootstrap,
            pipeline_stages(
                t, settings.worker.app_id, settings.trainer.group_id, settings.samples_topic
            ),
            every_s=g.lag_every_s,
        )
        self.consumer_lag = ConsumerLag(self.lag)
        self.metrics.registry.register(self.consumer_lag)
        self._sweeper = Background()
        self._database_watch = Background()
        self._background: set[asyncio.Task[None]] = set()
        self._admin_db: AsyncEngine | None = None  # made by the first forget
        # what else in this process holds a session's data (stored Responses)
        self.on_forget: list[Callable[[Collection[str]], None]] = [self.skills.forget]

    async def start(self) -> None:
        quiet_reconnects()
        await self.upstream.start()
        await self.sessions.start()
        await self.publisher.start()
        with contextlib.suppress(Exception):  # the spool of an earlier run goes first
            await asyncio.wait_for(self.publisher.drain(), 10)
        await self.pool.start()
        self._sweeper.start(self._sweep_idle())
        self._database_watch.start(self._watch_database())
        if self.archive_check is not None:
            self.archive_check.start()
        if self.settings.gateway.lag_every_s > 0:
            self.lag.start()
        # A call allocates thousands of short-lived objects (token lists, parsed bodies) and
        # frees them by reference counting; the cyclic collector's frequent young-generation
        # passes over a large heap then cost more than the call itself. Objects alive after
        # start-up are exempt from collection, and young passes run 50 times less often.
        gc.freeze()
        gc.set_threshold(GC_THRESHOLD, 20, 20)

    async def stop(self) -> None:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            multiprocess.mark_process_dead(os.getpid())
        await self._sweeper.stop()
        await self._database_watch.stop()
        if self.archive_check is not None:
            await self.archive_check.stop()
        await self.lag.stop()
        await self.pool.stop()
        await self.publisher.stop()
        await self.sessions.stop()
        if self._admin_db is not None:
            await self._admin_db.dispose()
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
            except Exception as exc:
                if not self.sessions.outage.caught(exc):
                    log.exception("idle sweep failed")

    async def _watch_database(self) -> None:
        """Every second: is Postgres there? Once it is back, write what waited for it (the
        sessions' counts, main-line heads, ends), in that order."""
        while True:
            await asyncio.sleep(1.0)
            try:
                if not await self.sessions.catch_up():
                    continue
                if self.lines is not None:
                    await self.lines.catch_up()
                for session_id, reason in list(self.sessions.ends.items()):
                    ended = await self.sessions.end(session_id, reason)
                    del self.sessions.ends[session_id]
                    if ended is not None:
                        await self.emit(
                            SessionEvent(
                                session_id=session_id,
                                kind="ended",
                                reason=reason,
                                n_steps=ended.n_steps,
                            )
                        )
            except Exception as exc:
                if not self.sessions.outage.caught(exc):
                    log.exception("writing the outage's journal failed")

    def journal_depth(self) -> int:
        """Records waiting for Postgres: session counts and ends, main-line heads."""
        unstored = len(self.lines.unstored) if self.lines is not None else 0
        return self.sessions.journal_depth() + unstored

    def health(self) -> dict[str, Any]:
        """What /healthz says about the road of recorded events: degraded, with the reasons,
        while a topic differs from its spec, the spool does not drain or the archive lags."""
        g = self.settings.gateway
        spool_age = self.publisher.slot.oldest_age_s()
        problems = [f"topic {t} differs from its spec: {w}" for t, w in self.guard.wrong.items()]
        if spool_age > g.spool_alarm_s:
            why = self.publisher.last_error or "the broker does not take them"
            problems.append(f"spooled events wait for {spool_age:.0f} s: {why}")
        outage = self.sessions.outage
        if outage.down:
            problems.append(
                f"Postgres is unreachable for {outage.seconds():.0f} s ({outage.last_error}):"
                f" known sessions are served; {self.journal_depth()} records wait in the journal,"
                " new keys and /rl/start_session get 503"
            )
        figures: dict[str, Any] = {
            "spooled": self.publisher.slot.depth(),
            "spool_oldest_s": spool_age,
            "postgres": "down" if outage.down else "up",
            "journal": self.journal_depth(),
        }
        if self.archive_check is not None:
            age = self.archive_check.oldest_age_s()
            figures |= {
                "unarchived": len(self.archive_check.journal),
                "unarchived_oldest_s": age,
                "resent": self.archive_check.figures.resent,
            }
            if age > g.archive_alarm_s:
                problems.append(
                    f"events wait for the archive for {age:.0f} s (is a worker running?)"
                )
        return {"status": "degraded" if problems else "ok", "problems": problems, **figures}

    async def forget(
        self,
        *,
        session_id: str | None = None,
        api_key: str | None = None,
        before: datetime | None = None,
        tenant: str | None = None,
    ) -> consent.Forgotten:
        """Delete the named sessions from every table, tell the pipeline (a `forgotten` event
        each) and drop what this process holds of them; tombstones on compacted topics. A
        tenant's forget takes its sessions and its adapter: unloaded from the engines now,
        its versions deleted, its checkpoints deleted by the trainer (`forgotten_tenants`)."""
        if self._admin_db is None:
            self._admin_db = make_engine(self.settings.database_url)
        async with self._admin_db.begin() as conn:
            if tenant is not None:
                ids = await consent.tenant_sessions(conn, tenant)
                done = await consent.forget(conn, ids) if ids else consent.Forgotten([])
                done.removed |= await consent.forget_tenant(conn, tenant)
                user: str | None = user_scope(tenant, None)
            else:
                ids = await consent.find_sessions(
                    conn, session_id=session_id, api_key=api_key, before=before
                )
                done = await consent.forget(conn, ids)
                user = user_scope(None, consent.hash_key(api_key)) if api_key else None
            if user is not None:  # the user's own skills, whatever taught them
                gone = await skill_store.forget_scope(conn, user)
                done.removed["skills"] = done.removed.get("skills", 0) + gone
        if tenant is not None:
            # every engine this gateway knows, at once (an engine that is down has lost them)
            done.removed["engine adapters"] = await unload_everywhere(
                self.http,
                [b.url for b in self.pool.backends],
                self.settings.resolved_admin_key(),
                tenant,
            )
        self.sessions.drop_cached(done.sessions)
        for hook in self.on_forget:
            hook(done.sessions)
        for sid in done.sessions:
            await self.emit(SessionEvent(session_id=sid, kind="forgotten"))
        compacted = [
            s.name for s in specs_for(self.settings.topics) if "compact" in s.cleanup_policy
        ]
        if compacted:
            producer = make_producer(self.settings.kafka_bootstrap)
            await producer.start()
            try:
                for topic in compacted:
                    for sid in done.sessions:
                        await producer.send_and_wait(topic, None, key=sid.encode())
            finally:
                await producer.stop()
        log.info("forgot %d session(s): %s", len(done.sessions), done.removed)
        return done

    def forget_keeps(self) -> str:
        """What a forget cannot delete in place, from the topics' retention."""
        kept = [
            f"{s.name} ({'forever' if s.retention_ms < 0 else f'{s.retention_ms / 86_400_000:g} days'})"
            for s in specs_for(self.settings.topics)
            if "compact" not in s.cleanup_policy
        ]
        return (
            "Kafka keeps the records until each topic's retention: "
            + ", ".join(kept)
            + ". The worker, replay and the trainer skip forgotten sessions; shorten a "
            "topic's retention.ms (or recreate it) to remove its records sooner."
        )

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

    def scrub(self, text: object, instead: str) -> str:
        """`str(text)` redacted (a client's body, or an error that quotes it), not cached;
        `instead` where a custom redactor fails on it."""
        if self.redactor is None:
            return str(text)
        try:
            return self.redactor.text(str(text), cache=False).text
        except RedactionError:
            return instead

    async def dead_letter(self, key: str, payload: dict[str, Any], exc: Exception) -> None:
        letter = DeadLetter(
            source_topic=self.topics.steps,
            key=key,
            value=self.scrub(
                encode_json(payload, anything_as_text=True).decode(),
                "(withheld: a custom redactor failed on it)",
            ),
            error_type=type(exc).__name__,
            error=self.scrub(exc, f"{type(exc).__name__} (withheld)")[:4000],
            processor="gateway",
        )
        await self.publisher.publish(self.topics.dlq, key, letter)
