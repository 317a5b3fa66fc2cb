"""`claw-stream worker`: the Faust app; each agent hands its batches to its own stage
(`stages/`, routed by worker.py).

    stitch    claw.steps + claw.session-events -> claw.turns     (one agent: per-session order)
    judge     claw.turns -> claw.judgements                      (concurrent, capped)
    assemble  claw.judgements -> claw.samples                    (through the Postgres outbox)
    weights   claw.weights -> releases held samples
    sweeper   a timer on every worker: idle sessions, late closes, held and orphaned samples

Workers started with the same app id share the partitions. Records are values only
(`raw`): each handler decodes with the event contract and sends what it cannot use to the DLQ.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import faust
from aiokafka.errors import CommitFailedError
from faust.transport.drivers import aiokafka as faust_kafka
from faust.types.tuples import ack_lock

from claw_stream.settings import Settings
from claw_stream.store.db import is_database_down
from claw_stream.worker.worker import Record, Worker

log = logging.getLogger(__name__)
# Faust asks for 1.5 s fetch long-polls; Tansu does not end one early when data arrives, so
# every hop of the pipeline would wait ~0.5 s on average (measured). A short wait costs
# a few idle fetches a second and makes a hop take milliseconds.
FETCH_MAX_WAIT_MS = 50


def _commit_failures_as_rebalances(commit: Any) -> Any:
    """Faust 0.15.3 takes a failed commit for a rebalance only when the error's text says
    "already rebalanced", and crashes the consumer otherwise; aiokafka 0.14 words that error
    across a line break, so every commit refused after a rebalance or a broker restart crashed
    the worker's consumer (seen in the broker-loss test). The refusal is what a rebalance
    looks like: say so in the words Faust looks for; the new assignment resumes from the
    group's committed offsets."""

    async def commit_or_rebalanced(*args: Any, **kwargs: Any) -> None:
        try:
            await commit(*args, **kwargs)
        except CommitFailedError as exc:
            raise CommitFailedError("already rebalanced") from exc

    return commit_or_rebalanced


class _ConsumerThread(faust_kafka.AIOKafkaConsumerThread):
    memberships = itertools.count(1)

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
        consumer.commit = _commit_failures_as_rebalances(consumer.commit)
        return consumer

    def _new_membership(self) -> int:
        """Each rebalance starts a membership of its own, numbered in this process: Faust tells
        a message read in an earlier one by its group generation, and a broker restarted empty
        numbers its groups' generations from 0 again (the embedded broker does), so a message
        read from the old log looked current in the new group (see _Consumer.ack). From the
        revocation on, what was read before is of an earlier membership."""
        self.app.consumer_generation_id = next(self.memberships)
        return int(self.app.consumer_generation_id)

    async def on_partitions_revoked(self, revoked: set[Any]) -> None:
        self._new_membership()
        await super().on_partitions_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[Any], generation_id: int = 0) -> None:
        await super().on_partitions_assigned(assigned, self._new_membership())


class _Consumer(faust_kafka.Consumer):
    def _new_consumer_thread(self) -> _ConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def ack(self, message: Any) -> bool:
        """A message read in an earlier membership is acknowledged without its offset: that
        offset belongs to the log and the assignment it was read from. Faust acknowledges
        every message its streams let go, stale ones included; one read from a log the broker
        lost and acknowledged after the worker had rejoined the restarted broker's group made
        the worker commit an old offset there (31, say, on a new log of 5 records), and its
        next assignment, after the topics were applied, started at it: the new log's records
        below it, the gateway's resends among them, were never read (a Step of the broker-loss
        test not archived after 60 s)."""
        if message.generation_id != self.app.consumer_generation_id:
            with ack_lock:
                message.acked = True
                self._unacked_messages.discard(message)
            return False
        return bool(super().ack(message))


class _Transport(faust_kafka.Transport):
    Consumer = _Consumer


class WorkerApp(faust.App):
    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)


def broker_urls(bootstrap: str) -> list[str]:
    return [f"kafka://{host.strip()}" for host in bootstrap.split(",") if host.strip()]


def create_app(settings: Settings, worker: Worker | None = None) -> faust.App:
    c, t = settings.worker, settings.topics
    datadir = settings.data_dir / "worker" / c.app_id
    if c.instance is not None:  # one of several workers on this data dir (`up --workers N`)
        datadir = datadir / c.instance
    datadir.mkdir(parents=True, exist_ok=True)
    worker = worker or Worker(
        c,
        settings.kafka_bootstrap,
        settings.database_url,
        settings.policy_name,
        t,
        settings.eval.holdout_share,
        settings.skills,
    )
    app = WorkerApp(
        c.app_id,
        broker=broker_urls(settings.kafka_bootstrap),
        value_serializer="raw",
        key_serializer="raw",
        web_enabled=False,
        topic_allow_declare=False,  # topics come from `topics apply` (topics/*.yaml)
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        broker_commit_interval=1.0,
        # a SIGKILLed worker's partitions move to the others within seconds, not minutes
        broker_session_timeout=10.0,
        broker_heartbeat_interval=1.0,
        broker_rebalance_timeout=20.0,
        broker_max_poll_interval=1800.0,  # a judged batch may take long on CPU
        stream_buffer_maxsize=c.stream_buffer,
        datadir=str(datadir),
    )

    async def run(stage: Callable[[list[Record]], Awaitable[None]], stream: Any) -> None:
        """Records in small batches, each handed to the agent's own stage. A batch is
        acknowledged once every record of it was handled."""
        await worker.start()
        async for events in stream.take_events(c.batch_max, within=c.batch_within_s):
            records = [
                Record(
                    e.message.topic,
                    e.message.value,
                    e.message.partition,
                    e.message.offset,
                    e.message.key,
                )
                for e in events
            ]
            await stage(records)

    @app.agent(app.topic(t.steps, t.session_events), name="stitch")
    async def stitch(stream: Any) -> None:
        await run(worker.stitch, stream)

    @app.agent(app.topic(t.turns), name="judge")
    async def judge(stream: Any) -> None:
        await run(worker.judge, stream)

    @app.agent(app.topic(t.judgements), name="assemble")
    async def assemble(stream: Any) -> None:
        await run(worker.assemble, stream)

    @app.agent(app.topic(t.weights), name="weights")
    async def weights(stream: Any) -> None:
        await run(worker.weights, stream)

    @app.timer(interval=c.sweep_interval_s)
    async def sweeper() -> None:
        await worker.start()
        try:
            await worker.sweep()
        except Exception as exc:
            if worker.stopping:  # the clients closed under a sweep that outlasted the wait
                log.debug("sweep ended by the shutdown: %r", exc)
            elif is_database_down(exc):  # a Postgres restart: one line, not a traceback
                log.warning(
                    "sweep waits for Postgres (%r); again in %.1fs", exc, c.sweep_interval_s
                )
            else:
                log.exception("sweep failed; it runs again in %.1fs", c.sweep_interval_s)

    @app.on_partitions_revoked.connect
    async def _revoked(app: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        worker.revoked(args[0])  # the topic-partitions taken from this worker

    @app.on_partitions_assigned.connect
    async def _assigned(app: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        worker.assigned(args[0])  # this worker's whole new assignment

    @app.on_before_shutdown.connect
    async def _stop(app: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        await worker.stop()

    return app
