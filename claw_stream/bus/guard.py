"""A producer's check of its topics against `topics/*.yaml`: missing ones are created from the
spec, a topic with another partition count is an alarm and is never written to.

Why refuse a wrong topic rather than write to it: records are keyed by session and a session's
events must share a partition; a topic with fewer partitions than the spec maps keys elsewhere
than the one the consumers' state was built with, and one that Tansu auto-created after a
restart (4 partitions for a spec of 6) fails every send to partitions 4 and 5 for good. The
events wait in the producer's spool until an operator recreates the topic (`topics apply`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from aiokafka.errors import KafkaError
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from claw_stream.bus.topics import TopicSpec, apply_topics, specs_for
from claw_stream.names import Topics

log = logging.getLogger(__name__)


async def check_topics(bootstrap: str, topics: Topics) -> None:
    """At a service's start: create missing topics from their specs, log the ones that differ
    (a broker that does not answer yet is the service's own reconnecting to deal with)."""
    try:
        await TopicGuard(bootstrap, specs_for(topics), refuses=False).check(force=True)
    except (KafkaError, OSError, TimeoutError) as exc:
        log.warning("cannot check the topics at %s yet: %r", bootstrap, exc)


@dataclass
class TopicGuard:
    bootstrap: str
    specs: list[TopicSpec]
    min_interval_s: float = 2.0  # after errors, checks come at most this often
    wrong: dict[str, str] = field(default_factory=dict)  # topic -> what differs from its spec
    checked_at: float = 0.0
    created: list[str] = field(default_factory=list)
    refuses: bool = True  # the caller writes nothing to a wrong topic (the gateway)

    def is_wrong(self, topic: str) -> bool:
        return topic in self.wrong

    async def check(self, *, force: bool = False, create: bool = True) -> dict[str, str]:
        """Create missing topics, find wrong ones; the wrong ones (empty: all as specified).
        Raises KafkaError/OSError/TimeoutError while the broker does not answer."""
        now = time.monotonic()
        if not force and now - self.checked_at < self.min_interval_s:
            return self.wrong
        self.checked_at = now
        try:
            reports = await apply_topics(
                self.bootstrap, self.specs, request_timeout_ms=5_000, create=create
            )
        except RuntimeError as exc:  # a create the broker refused
            raise KafkaError(str(exc)) from exc
        wrong = {}
        for report in reports:
            if report.action == "created":
                self.created.append(report.topic)
                log.warning("topic %s was missing; created it from its spec", report.topic)
            bad = [d for d in report.drift if d.startswith("partitions")]
            if bad:
                wrong[report.topic] = "; ".join(bad)
        for topic, what in wrong.items():
            if topic not in self.wrong:
                log.error(
                    "topic %s differs from its spec (%s)%s; recreate it (`claw-stream topics "
                    "apply` reports every difference)",
                    topic,
                    what,
                    ": nothing is written to it, its events wait in the spool"
                    if self.refuses
                    else "",
                )
        for topic in set(self.wrong) - set(wrong):
            log.warning("topic %s matches its spec again", topic)
        self.wrong = wrong
        return wrong


class TopicWrong(KafkaError):
    """A write refused because its topic differs from its spec; a KafkaError, so the callers'
    retries of broker errors retry it until the topic is fixed."""


@dataclass
class WriteGuard:
    """The worker's and trainer's check before each write: the topics are checked again after a
    write failed or was refused (at most every `guard.min_interval_s`) and otherwise every
    `every_s`, so a broker that came back with a topic auto-created wrong is noticed without a
    metadata round trip per record."""

    guard: TopicGuard
    every_s: float = 30.0
    suspect: bool = True  # check before the first write
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def at_start(self) -> None:
        """Create missing topics, find wrong ones; a broker not answering yet is logged only
        (the service's own reconnecting deals with it)."""
        try:
            await self.guard.check(force=True)
            self.suspect = bool(self.guard.wrong)
        except (KafkaError, OSError, TimeoutError) as exc:
            log.warning("cannot check the topics at %s yet: %r", self.guard.bootstrap, exc)

    async def before_write(self, topic: str) -> None:
        """Raises TopicWrong while `topic` differs from its spec."""
        if self._due():
            async with self._lock:
                if self._due():
                    try:
                        # check only: after a broker restart the topics are created by the
                        # gateway and the supervisor; a third creator racing them left Tansu
                        # failing produces to claw.steps with UnknownError for over a minute
                        await self.guard.check(force=True, create=False)
                    except (KafkaError, OSError, TimeoutError) as exc:
                        # the write will meet the same broker: its own error is the one to see
                        log.warning("cannot check the topics before a write: %r", exc)
                    else:
                        self.suspect = bool(self.guard.wrong)
        if self.guard.is_wrong(topic):
            self.suspect = True
            raise TopicWrong(
                f"topic {topic} differs from its spec ({self.guard.wrong[topic]}): nothing is "
                "written to it until it is recreated (`claw-stream topics apply`)"
            )

    def failed(self) -> None:
        """A write failed: check the topics before the next one."""
        self.suspect = True

    def _due(self) -> bool:
        age = time.monotonic() - self.guard.checked_at
        return age >= self.every_s or (self.suspect and age >= self.guard.min_interval_s)


class TopicWrongGauge(Collector):
    """`<name>{topic}`: 1 while the topic differs from its spec (nothing is written to it)."""

    def __init__(self, name: str, guard: TopicGuard):
        self.name = name
        self.guard = guard

    def collect(self) -> Iterator[GaugeMetricFamily]:
        wrong = GaugeMetricFamily(
            self.name,
            "1 while a topic differs from its spec (nothing is written to it)",
            labels=["topic"],
        )
        for spec in self.guard.specs:
            wrong.add_metric([spec.name], 1.0 if spec.name in self.guard.wrong else 0.0)
        yield wrong
