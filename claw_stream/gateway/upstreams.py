"""Inference backends: least-loaded choice with session affinity, health checks, failover."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import httpx
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from claw_stream.dialect import OpenAIError
from claw_stream.gateway.background import Background

log = logging.getLogger(__name__)
AFFINITY_SLACK = 4  # in-flight requests a preferred backend may have over the least loaded
RETRY_AFTER = {"Retry-After": "1"}


class UpstreamUnavailable(Exception):
    """The backend could not be reached or answered 5xx before any byte went to the client."""


@dataclass(eq=False)
class Backend:
    url: str  # base URL without /v1
    inflight: int = 0
    healthy: bool = True
    failures: int = 0
    max_model_len: int | None = None  # its served context, from /v1/models
    models: tuple[str, ...] = ()  # the names it serves, from /v1/models: the policy first


def normalise(url: str) -> str:
    url = url.strip().rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class BackendPool:
    def __init__(
        self,
        urls: list[str],
        client: httpx.AsyncClient,
        health_interval_s: float = 5.0,
        *,
        hosted: bool = False,
        api_key: str | None = None,
    ):
        if not urls:
            raise ValueError("at least one backend URL is needed")
        self.backends = [Backend(normalise(u)) for u in urls]
        self.client = client
        self.health_interval_s = health_interval_s
        # a hosted API has no /health: it is healthy when it lists its models to our key
        self.hosted = hosted
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._loop_task = Background()

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

    def context_len(self) -> int | None:
        """The smallest context any backend serves (they serve one model), when known."""
        known = [b.max_model_len for b in self.backends if b.max_model_len]
        return min(known) if known else None

    def mark_failed(self, backend: Backend) -> None:
        backend.failures += 1
        backend.healthy = False

    async def check(self) -> None:
        async def one(b: Backend) -> None:
            path = "/v1/models" if self.hosted else "/health"
            try:
                answer = await self.client.get(f"{b.url}{path}", headers=self.headers, timeout=2.0)
                ok = answer.status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok != b.healthy:
                log.info("backend %s is %s", b.url, "healthy" if ok else "unhealthy")
            b.healthy = ok
            if ok:  # adapters come and go (the trainer loads policy@vN): read them each time
                await self._read_models(b)

        await asyncio.gather(*(one(b) for b in self.backends))

    async def _read_models(self, b: Backend) -> None:
        """The names `b` serves and its context, as vLLM and the built-in engine list them in
        /v1/models (the served model first, then its adapters)."""
        try:
            listed = await self.client.get(f"{b.url}/v1/models", headers=self.headers, timeout=2.0)
            cards = listed.json()["data"]
            names = tuple(str(card["id"]) for card in cards)
            length = cards[0].get("max_model_len")
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError, AttributeError):
            return
        b.models = names
        if isinstance(length, int) and length > 0:
            b.max_model_len = length

    async def start(self) -> None:
        await self.check()
        self._loop_task.start(self._loop())

    async def stop(self) -> None:
        await self._loop_task.stop()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self.check()


class Upstream:
    """Sends a call to a backend of the pool, failing over to the others.

    The hot path uses aiohttp: per request it costs about half of httpx's CPU."""

    def __init__(
        self,
        pool: BackendPool,
        timeout_s: float,
        on_error: Callable[[Backend], None] = lambda backend: None,
    ):
        self.pool = pool
        self.headers = {"content-type": "application/json", **pool.headers}
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=2.0, sock_read=timeout_s)
        self.on_error = on_error
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self.session = aiohttp.ClientSession(
            timeout=self.timeout,
            connector=aiohttp.TCPConnector(limit=1024, ttl_dns_cache=300),
            auto_decompress=False,
        )

    async def stop(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def send(
        self, payload: bytes, session_id: str, path: str = "/v1/chat/completions"
    ) -> tuple[Backend, aiohttp.ClientResponse]:
        """POST `payload` to a healthy backend; the caller releases the response and takes
        one off the backend's `inflight` when done. 503 when none can answer."""
        tried: set[Backend] = set()

        async def attempt() -> tuple[Backend, aiohttp.ClientResponse]:
            backend = self.pool.choose(session_id, tried)
            if backend is None:
                raise OpenAIError(
                    503, "no inference backend can answer right now", headers=RETRY_AFTER
                )
            tried.add(backend)
            assert self.session is not None, "Upstream.start() first"
            backend.inflight += 1
            try:
                response = await self.session.post(
                    f"{backend.url}{path}",
                    data=payload,
                    headers=self.headers,
                )
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                backend.inflight -= 1
                self.pool.mark_failed(backend)
                self.on_error(backend)
                raise UpstreamUnavailable(f"{backend.url}: {type(exc).__name__}: {exc}") from exc
            if response.status >= 500:
                await response.read()
                response.release()
                backend.inflight -= 1
                self.on_error(backend)
                raise UpstreamUnavailable(f"{backend.url} answered {response.status}")
            return backend, response

        try:
            return await attempt()
        except UpstreamUnavailable:
            pass  # the common case needs no retry machinery; the rest goes through tenacity
        attempts = len(self.pool.backends)
        try:
            async for retry in AsyncRetrying(
                stop=stop_after_attempt(attempts),
                retry=retry_if_exception_type(UpstreamUnavailable),
                reraise=True,
            ):
                with retry:
                    return await attempt()
        except UpstreamUnavailable as exc:
            raise OpenAIError(
                503, f"no inference backend can answer: {exc}", headers=RETRY_AFTER
            ) from None
        raise AssertionError("unreachable")


async def read_whole(backend: Backend, response: aiohttp.ClientResponse) -> bytes:
    """The body of a response `send` returned, after which the response is released and the
    backend has one call fewer in flight; a backend that broke off mid-body is a 502."""
    try:
        return await response.read()
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise OpenAIError(502, f"the inference backend broke off: {exc}") from None
    finally:
        backend.inflight -= 1
        response.release()
