"""What every stage of the worker shares: Postgres, the producer behind the topic guard, the
events it sent (own_events.py), the decoded steps (step_cache.py), the metrics, dead letters,
and the sessions a stage made ready for the assembler. One per worker process.

Outputs are published before the state that says they were (a crash in between re-emits the
same derived id, which consumers dedupe); samples go through an outbox in Postgres, so a
sample is never lost between "assembled" and "on the topic".
"""

from __future__ import annotations

import base64
import functools
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    start_http_server,
)
from sqlalchemy.exc import DBAPIError, OperationalError
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from claw_stream.bus.guard import TopicGuard, TopicWrongGauge, WriteGuard
from claw_stream.bus.kafka import (
    make_producer,
    send_all_past_reset,
)
from claw_stream.bus.topics import specs_for
from claw_stream.events import (
    DeadLetter,
    E,
    Event,
    EventError,
    Judgement,
    Turn,
    decode_event,
    encode_event,
)
from claw_stream.names import Topics
from claw_stream.store.db import is_database_down, log_pauses, make_engine, stop_unless_away
from claw_stream.worker.config import WorkerSettings
from claw_stream.worker.prompt_files import load_prompts
from claw_stream.worker.reward_sources import load_sources
from claw_stream.worker.stages.own_events import OwnEvents
from claw_stream.worker.stages.step_cache import StepCache
from claw_stream.worker.state.rows import Pair

log = logging.getLogger(__name__)
INFRA_ERRORS = (OperationalError, DBAPIError, KafkaError, OSError, TimeoutError)


@dataclass(frozen=True)
class Record:
    topic: str
    value: bytes | None
    partition: int | None = None
    offset: int | None = None
    key: bytes | None = None


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.records = Counter(
            "claw_worker_records", "Records handled by agent", ["agent"], registry=r
        )
        self.dead_letters = Counter(
            "claw_worker_dead_letters", "Records sent to the DLQ", ["agent"], registry=r
        )
        self.turns = Counter("claw_worker_turns", "Turns emitted by reason", ["reason"], registry=r)
        self.skills = Counter(
            "claw_worker_skills",
            "Lessons taken from judged turns (new = a skill of its own, confirmed = a "
            "near-duplicate taught again, promoted = taught to everyone)",
            ["outcome"],
            registry=r,
        )
        self.samples = Counter(
            "claw_worker_samples",
            "Samples by release status (pending = published, dropped = stale)",
            ["status"],
            registry=r,
        )
        self.judge_seconds = Histogram(
            "claw_worker_judge_seconds", "Time to judge one turn", registry=r
        )
        self.judge_errors = Counter(
            "claw_worker_judge_errors", "Judge requests failed after retries", registry=r
        )
        self.judge_timeouts = Counter(
            "claw_worker_judge_timeouts", "Judge requests that timed out after retries", registry=r
        )
        self.judge_deferred = Counter(
            "claw_worker_judge_deferred",
            "Turns the judge could not answer (timeouts, busy), kept to be judged again",
            registry=r,
        )
        self.judge_gave_up = Counter(
            "claw_worker_judge_gave_up",
            "Kept turns dead-lettered after worker.judge_give_up_after_s",
            registry=r,
        )
        self.judge_waiting = Gauge(
            "claw_worker_judge_waiting",
            "Turns kept to be judged again (all workers, as of this worker's last sweep)",
            registry=r,
        )
        self.judge_in_flight = Gauge(
            "claw_worker_judge_in_flight",
            "Judge requests sent or waiting for a slot (worker.judge_concurrency)",
            registry=r,
        )
        self.token_drift = Counter(
            "claw_token_drift",
            "Turns whose prompt ids did not continue the previous turn's prompt and answer ids "
            "where their messages did, by what was done (worker.token_drift: keep | drop)",
            ["action"],
            registry=r,
        )
        self.judge_prompts_cut = Counter(
            "claw_worker_judge_prompts_cut",
            "Turns whose judge prompt left out old history to fit the judge's context",
            registry=r,
        )
        self.steps = Counter(
            "claw_worker_steps",
            "Steps placed, by turn type as classified and why (header, first, extends, ...)",
            ["turn_type", "why"],
            registry=r,
        )
        self.partitions = Gauge(
            "claw_worker_partitions",
            "Partitions of each topic this worker holds in its consumer group now (0: the "
            "group's other workers hold them all)",
            ["topic"],
            registry=r,
        )
        self.segments = Counter(
            "claw_worker_segments_resumed",
            "Segments opened by steps after a close (a session resumed)",
            registry=r,
        )
        self.untrained = Counter(
            "claw_worker_turns_untrained",
            "Turns neither judged nor trained, by why: the step or its session switched off, "
            "or held out for the replay",
            ["why"],
            registry=r,
        )
        self.forgotten = Counter(
            "claw_worker_records_forgotten",
            "Records of forgotten sessions dropped unarchived",
            registry=r,
        )
        self.step_cache = _memory_gauges(
            "step_cache",
            (
                "JSON size of the decoded steps held in memory (worker.step_cache_mb)",
                "Steps of open segments the stitcher took from memory",
                "Steps of open segments the stitcher read and decoded from Postgres",
            ),
            r,
        )
        self.own_events = _memory_gauges(
            "own_events",
            (
                "Turns and judgements sent and held until read back (worker.own_events_mb)",
                "Turns and judgements read back as sent, taken without decoding",
                "Turns and judgements read that this worker did not send: decoded",
            ),
            r,
        )
        self.unconsidered = Counter(
            "claw_worker_steps_not_considered",
            "Steps archived but never placed for stitching, judging and training (should be 0)",
            registry=r,
        )

    @staticmethod
    def watch(gauges: dict[str, Gauge], held: StepCache | OwnEvents) -> None:
        """Gauges made by `_memory_gauges` read from `held` at each scrape."""
        for name, gauge in gauges.items():
            gauge.set_function(functools.partial(getattr, held, name))


def _memory_gauges(
    prefix: str, docs: tuple[str, str, str], registry: CollectorRegistry
) -> dict[str, Gauge]:
    """claw_worker_<prefix>_{bytes,hits,misses} of something the worker holds in memory."""
    return {
        name: Gauge(f"claw_worker_{prefix}_{name}", doc, registry=registry)
        for name, doc in zip(("bytes", "hits", "misses"), docs, strict=True)
    }


INFRA_ATTEMPTS = 30  # a database error that is no outage, tried this often (~4 min)


def _away(exc: BaseException) -> bool:
    return isinstance(exc, KafkaError) or is_database_down(exc)


def infra_retries() -> AsyncRetrying:
    """Retries while Postgres or the broker is away (INFRA_ERRORS), backing off to 10 s: never
    given up while either is unreachable (the stage pauses on its record, not acknowledged,
    so its place is kept, and goes on when they are back, dead-lettering nothing); any other
    database error is tried INFRA_ATTEMPTS times."""
    return AsyncRetrying(
        retry=retry_if_exception_type(INFRA_ERRORS),
        wait=wait_exponential(multiplier=0.5, max=10) + wait_random(0, 0.5),
        stop=stop_unless_away(_away, stop_after_attempt(INFRA_ATTEMPTS)),
        before_sleep=log_pauses("paused, retrying", log),
        reraise=True,
    )


class WorkerIO:
    """Clients of one worker process (Postgres, a producer, the topic guard) and what its
    stages share."""

    def __init__(
        self,
        config: WorkerSettings,
        kafka_bootstrap: str,
        database_url: str,
        policy: str = "policy",
        topics: Topics | None = None,
        holdout_share: float = 0.0,
    ):
        self.config = config
        self.holdout_share = holdout_share  # eval.holdout_share: turns replayed, never trained
        self.topics = topics or Topics()
        self.bootstrap = kafka_bootstrap
        self.database_url = database_url
        self.policy = policy
        # prompt files and reward plugins are read now: a bad one stops the worker at start
        self.prompts = load_prompts(config)
        self.sources = load_sources(config)
        self.metrics = WorkerMetrics()
        Info(
            "claw_worker", "This worker's consumer group and judge", registry=self.metrics.registry
        ).info({"app_id": config.app_id, "judge_url": config.judge_url})
        self.steps = StepCache(int(config.step_cache_mb * 2**20))
        self.metrics.watch(self.metrics.step_cache, self.steps)
        self.own = OwnEvents(int(config.own_events_mb * 2**20))
        self.metrics.watch(self.metrics.own_events, self.own)
        # nothing is written to a topic that differs from its spec (see bus/guard.py)
        self.guard = WriteGuard(TopicGuard(kafka_bootstrap, specs_for(self.topics)))
        self.metrics.registry.register(TopicWrongGauge("claw_worker_topic_wrong", self.guard.guard))
        self.producer: AIOKafkaProducer | None = None
        self.started = False
        self.ready: set[str] = set()  # sessions to release for at the end of the batch
        self.late: set[Pair] = set()  # segments whose episode reward came late
        self.models: dict[str, type[Event]] = {}  # what each topic carries: the worker's routes

    async def connect(self) -> None:
        self.db = make_engine(
            self.database_url, pool_size=self.config.session_concurrency + 4, max_overflow=4
        )
        await self.guard.at_start()
        self.producer = make_producer(self.bootstrap)
        await self.producer.start()
        if self.config.metrics_port is not None:
            start_http_server(
                self.config.metrics_port, self.config.metrics_host, registry=self.metrics.registry
            )
        self.started = True

    async def stop(self) -> None:
        if not self.started:
            return
        if self.producer is not None:
            await self.producer.stop()
        await self.db.dispose()
        self.started = False

    async def emit(self, topic: str, key: str, event: Event) -> None:
        await self.emit_all(topic, [(key, event)])

    async def emit_all(self, topic: str, events: Sequence[tuple[str, Event]]) -> None:
        """Send every (key, event) in order, then wait for all their acks at once."""
        if not events:
            return
        assert self.producer is not None
        await self.guard.before_write(topic)
        records = [(key.encode(), encode_event(event)) for key, event in events]
        # held before the send: this worker's own agent may fetch them before the ack is back
        held = topic in (self.topics.turns, self.topics.judgements)
        if held:
            for (_, raw), (_, event) in zip(records, events, strict=True):
                self.own.sent(raw, event, getattr(event, "session_id", ""))
        try:
            await send_all_past_reset(self.producer, topic, records)
        except BaseException as exc:
            if held:
                self.own.discard([raw for _, raw in records])
            if isinstance(exc, KafkaError):
                self.guard.failed()
            raise

    def decode(self, model: type[E], raw: bytes) -> E:
        """A record's event: the one this worker sent when the bytes are exactly those it
        encoded (see own_events.py), else decoded and validated (EventError when bad)."""
        return self.own_event(model, raw) or decode_event(model, raw)

    def own_event(self, model: type[E], raw: bytes) -> E | None:
        """The event this worker sent as `raw`; None for any other record, and for steps and
        session events (never sent from here) without looking."""
        return self.own.take(model, raw) if model in (Turn, Judgement) else None

    def decode_all(
        self, records: list[Record], texts: dict[uuid.UUID, str] | None = None
    ) -> list[Any] | None:
        """Every record's event, or None when one does not decode. `texts`: filled with the
        JSON of the events this worker sent as they were read back (exactly `encode_event`'s)."""
        out = []
        for r in records:
            model = self.models[r.topic]
            raw = r.value or b""
            event = self.own_event(model, raw)
            if event is not None and texts is not None:
                texts[event.id] = raw.decode()
            try:
                out.append(event or decode_event(model, raw))
            except EventError:
                return None
        return out

    async def dead_letter(
        self,
        processor: str,
        topic: str,
        value: bytes | None,
        error: BaseException,
        *,
        partition: int | None = None,
        offset: int | None = None,
        key: bytes | str | None = None,
    ) -> None:
        raw = value or b""
        try:
            text, encoding = raw.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            text, encoding = base64.b64encode(raw).decode(), "base64"
        key_text = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
        letter = DeadLetter(
            source_topic=topic,
            partition=partition,
            offset=offset,
            key=key_text,
            value=text,
            value_encoding=encoding,  # type: ignore[arg-type]
            error_type=type(error).__name__,
            error=str(error)[:4000],
            processor=processor,
        )
        self.metrics.dead_letters.labels(processor).inc()
        log.warning("dead letter from %s (%s): %s", processor, topic, letter.error[:300])
        await self.emit(self.topics.dlq, key_text or "", letter)
