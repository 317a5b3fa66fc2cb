"""The gateway's Prometheus metrics; with several processes, /metrics sums them all."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from claw_stream.gateway.spool import SpoolSlot


class SpoolDepth(Collector):
    """Events waiting in the spools of all the gateway's processes, read from their files
    at each scrape, so a process killed with records in its slot still counts them."""

    def __init__(self, slot: SpoolSlot):
        self.slot = slot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "claw_gateway_spool_depth", "Events waiting in the local spool", self.slot.depth()
        )


class Metrics:
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
