"""The gateway's Prometheus metrics; with several processes, /metrics sums them all."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from claw_stream.bus.guard import TopicGuard
from claw_stream.bus.lag import LagMonitor
from claw_stream.gateway.delivery.archive_check import ArchiveCheck
from claw_stream.gateway.delivery.spool import SpoolSlot
from claw_stream.gateway.redaction import Hits


class SpoolDepth(Collector):
    """Events waiting in the spools of all the gateway's processes, read from their files
    at each scrape, so a process killed with records in its slot still counts them; the age of
    the oldest; topics that differ from their specs; events waiting for the archive."""

    def __init__(
        self, slot: SpoolSlot, guard: TopicGuard | None = None, check: ArchiveCheck | None = None
    ):
        self.slot = slot
        self.guard = guard
        self.check = check

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "claw_gateway_spool_depth", "Events waiting in the local spool", self.slot.depth()
        )
        yield GaugeMetricFamily(
            "claw_gateway_spool_oldest_seconds",
            "Age of the oldest event in the local spool (0: empty)",
            self.slot.oldest_age_s(),
        )
        if self.guard is not None:
            wrong = GaugeMetricFamily(
                "claw_gateway_topic_wrong",
                "1 while a topic differs from its spec (nothing is written to it)",
                labels=["topic"],
            )
            for spec in self.guard.specs:
                wrong.add_metric([spec.name], 1.0 if spec.name in self.guard.wrong else 0.0)
            yield wrong
        if self.check is not None:
            yield GaugeMetricFamily(
                "claw_gateway_unarchived",
                "Events this process published that the worker's archive does not hold yet",
                len(self.check.journal),
            )
            yield GaugeMetricFamily(
                "claw_gateway_unarchived_oldest_seconds",
                "Age of the oldest of them",
                self.check.oldest_age_s(),
            )


class ConsumerLag(Collector):
    """`claw_consumer_lag{stage,topic}`: the monitor's last reading (none while the broker
    cannot be read), so a scrape costs no broker round trip."""

    def __init__(self, monitor: LagMonitor):
        self.monitor = monitor

    def collect(self) -> Iterator[GaugeMetricFamily]:
        lag = GaugeMetricFamily(
            "claw_consumer_lag",
            "Records of a topic its stage's consumer group has not consumed yet",
            labels=["stage", "topic"],
        )
        for item in self.monitor.last:
            lag.add_metric([item.stage, item.topic], float(item.lag))
        yield lag
        yield GaugeMetricFamily(
            "claw_consumer_lag_read_seconds",
            "How long the last reading of the consumer lag took",
            self.monitor.read_s,
        )


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "claw_gateway_requests", "Requests", ["route", "status"], registry=r
        )
        self.latency = Histogram(
            "claw_gateway_request_seconds",
            "End-to-end latency of chat requests",
            ["stream"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.upstream_errors = Counter(
            "claw_gateway_upstream_errors", "Upstream failures", ["backend"], registry=r
        )
        self.publish = Histogram(
            "claw_gateway_publish_seconds",
            "Time for the broker to acknowledge an event",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5),
            registry=r,
        )
        self.steps = Counter("claw_gateway_steps", "Steps recorded", ["outcome"], registry=r)
        self.redactions = Counter(
            "claw_gateway_redactions",
            "Secrets redacted from recorded Steps, by pattern (or custom redactor)",
            ["pattern"],
            registry=r,
        )
        self.resent = Counter(
            "claw_gateway_resent",
            "Events sent again because the broker lost them after acknowledging them",
            registry=r,
        )
        self.calls_without_store = Counter(
            "claw_gateway_calls_without_store",
            "Calls served while Postgres was away (their bookkeeping waited in the journal)",
            registry=r,
        )
        # an agent whose prompt does not fit the served model gets no answer at all: `doctor`
        # reads these to say which agent it was and what context would hold its prompt
        self.context_refused = Counter(
            "claw_gateway_context_refused",
            "Calls refused because their prompt does not fit the served context, by agent",
            ["agent"],
            registry=r,
        )
        self.refused_prompt = Gauge(
            "claw_gateway_refused_prompt_tokens",
            "The largest prompt refused for the served context, in tokens, by agent",
            ["agent"],
            multiprocess_mode="max",
            registry=r,
        )


def count_redactions(counter: Counter) -> Callable[[Hits], None]:
    """Add each redaction made to `claw_gateway_redactions_total{pattern}`."""

    def count(hits: Hits) -> None:
        for name, n in Tally(hits).items():
            counter.labels(name).inc(n)

    return count
