"""The engine's Prometheus metrics (served on `/metrics`), in a registry of their own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from claw_stream.engine.adapters import AdapterFigures, Adapters
from claw_stream.engine.prefix_cache import PrefixCache


class EngineMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "claw_engine_requests", "Requests by route and status", ["route", "status"], registry=r
        )
        self.tokens = Counter("claw_engine_generated_tokens", "Tokens generated", registry=r)
        self.prompt_tokens = Counter(
            "claw_engine_prompt_tokens", "Prompt tokens processed", registry=r
        )
        # every POST as it arrives, before its body is read or checked: what reached the
        # engine at all, refused or not (`requests` counts only the answered ones)
        self.arrivals = Counter(
            "claw_engine_arrivals", "POST requests received, by path", ["path"], registry=r
        )
        self.latency = Histogram(
            "claw_engine_request_seconds", "Request latency", ["route"], registry=r
        )
        self.running = Gauge("claw_engine_running_requests", "Requests in flight", registry=r)
        self.version = Gauge("claw_engine_weight_version", "Served base weight version", registry=r)
        self.swap = Histogram(
            "claw_engine_weight_swap_seconds", "Time to load and swap weights", registry=r
        )
        # as vLLM's prefix_cache_queries / prefix_cache_hits: in tokens
        self.prefix_queries = Counter(
            "claw_engine_prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache",
            registry=r,
        )
        self.prefix_hits = Counter(
            "claw_engine_prefix_cache_hits", "Prompt tokens found in the prefix cache", registry=r
        )
        self.prefix_bytes = Gauge(
            "claw_engine_prefix_cache_bytes", "Memory held by the prefix cache", registry=r
        )
        self._seen = (0, 0)
        self.adapters = Gauge(
            "claw_engine_adapters",
            "LoRA adapters registered and in the model",
            ["state"],
            registry=r,
        )
        self.adapter_loads = Counter(
            "claw_engine_adapter_loads",
            "Adapters brought into the model: first loads, and reloads of evicted ones",
            ["kind"],
            registry=r,
        )
        self.adapter_evictions = Counter(
            "claw_engine_adapter_evictions",
            "Idle adapters taken out of the model past engine.max_loaded_adapters",
            registry=r,
        )
        self.adapter_load_seconds = Counter(
            "claw_engine_adapter_load_seconds", "Time spent loading adapters", registry=r
        )
        self._adapters_seen = AdapterFigures()

    def sync_adapters(self, adapters: Adapters) -> None:
        """Bring the adapters' figures (counted on the engine thread) onto the metrics."""
        figures, seen = adapters.figures, self._adapters_seen
        self.adapters.labels("registered").set(len(adapters.versions))
        self.adapters.labels("resident").set(len(adapters.resident))
        first, first_seen = figures.loads - figures.reloads, seen.loads - seen.reloads
        self.adapter_loads.labels("first").inc(first - first_seen)
        self.adapter_loads.labels("reload").inc(figures.reloads - seen.reloads)
        self.adapter_evictions.inc(figures.evictions - seen.evictions)
        self.adapter_load_seconds.inc(figures.load_seconds - seen.load_seconds)
        self._adapters_seen = AdapterFigures(**vars(figures))

    def sync(self, prefix_cache: PrefixCache | None) -> None:
        """Bring the prefix cache's figures (counted on the engine thread) onto the counters."""
        if prefix_cache is None:
            return
        f = prefix_cache.figures
        queried, hit = f.queried_tokens, f.hit_tokens
        self.prefix_queries.inc(queried - self._seen[0])
        self.prefix_hits.inc(hit - self._seen[1])
        self._seen = (queried, hit)
        self.prefix_bytes.set(prefix_cache.used_bytes)
