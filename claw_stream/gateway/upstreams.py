"""Inference backends: least-loaded choice with session affinity, health checks, failover."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from dataclasses import dataclass

import httpx

log = logging.getLogger(__name__)
AFFINITY_SLACK = 4  # in-flight requests a preferred backend may have over the least loaded


@dataclass(eq=False)
class Backend:
    url: str  # base URL without /v1
    inflight: int = 0
    healthy: bool = True
    failures: int = 0


def normalise(url: str) -> str:
    url = url.strip().rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class BackendPool:
    def __init__(self, urls: list[str], client: httpx.AsyncClient, health_interval_s: float = 5.0):
        if not urls:
            raise ValueError("at least one backend URL is needed")
        self.backends = [Backend(normalise(u)) for u in urls]
        self.client = client
        self.health_interval_s = health_interval_s
        self._task: asyncio.Task[None] | None = None

    def choose(self, session_id: str | None, exclude: set[Backend]) -> Backend | None:
        """The session's preferred backend (its prefix cache is there) unless it is much busier."""
        healthy = [b for b in self.backends if b.healthy and b not in exclude]
        if not healthy:
            # nothing known healthy: try the ones not yet tried rather than give up
            healthy = [b for b in self.backends if b not in exclude]
            if not healthy:
                return None
        least = min(healthy, key=lambda b: b.inflight)
        if session_id is None:
            return least
        preferred = max(
            healthy,
            key=lambda b: hashlib.blake2b(f"{session_id}|{b.url}".encode(), digest_size=8).digest(),
        )
        return preferred if preferred.inflight <= least.inflight + AFFINITY_SLACK else least

    def mark_failed(self, backend: Backend) -> None:
        backend.failures += 1
        backend.healthy = False

    async def check(self) -> None:
        async def one(b: Backend) -> None:
            try:
                ok = (await self.client.get(f"{b.url}/health", timeout=2.0)).status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok != b.healthy:
                log.info("backend %s is %s", b.url, "healthy" if ok else "unhealthy")
            b.healthy = ok

        await asyncio.gather(*(one(b) for b in self.backends))

    async def start(self) -> None:
        await self.check()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self.check()
