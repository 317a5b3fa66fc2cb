"""Counting what reaches the engine at all: every POST as it arrives, before its body is read
or checked, so a refused request counts too (`EngineMetrics.requests` counts only answered ones)."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from claw_stream.engine.metrics import EngineMetrics

# the engine's POST routes; any other path counts as "other" (labels stay bounded)
POST_PATHS = frozenset(
    (
        "/v1/chat/completions",
        "/v1/completions",
        "/tokenize",
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
        "/admin/load_weights",
    )
)


class CountArrivals:
    """ASGI middleware: counts each POST in `EngineMetrics.arrivals` before the app sees it."""

    def __init__(self, app: ASGIApp, metrics: EngineMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path = scope["path"]
            self.metrics.arrivals.labels(path if path in POST_PATHS else "other").inc()
        await self.app(scope, receive, send)
