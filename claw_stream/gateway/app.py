"""The gateway's routes: OpenAI-compatible chat in front of the engines, and the session API."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from pydantic import ValidationError
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from claw_stream.dialect import OpenAIError, error_body, install_error_handlers
from claw_stream.events import DeadLetter, Event, EventError, SessionEvent, Step
from claw_stream.gateway.capture import (
    ClientAsked,
    StepContext,
    StreamCapture,
    build_step,
    check_request,
    encode_json,
    parse_answer,
    prepare_upstream,
    strip_response,
    weight_version,
)
from claw_stream.gateway.front_door import DONE, FrontDoor, read_body
from claw_stream.gateway.models import (
    SESSION_FIELDS,
    Accepted,
    ChatRequest,
    EndSessionRequest,
    FeedbackRequest,
    RewardRequest,
    StartSessionRequest,
    StartSessionResponse,
)
from claw_stream.gateway.publisher import EventPublisher
from claw_stream.gateway.sessions import SessionStore
from claw_stream.gateway.spool import SpoolSlot
from claw_stream.gateway.upstreams import Backend, BackendPool
from claw_stream.ids import uuid7
from claw_stream.settings import Settings

log = logging.getLogger(__name__)
RETRY_AFTER = {"Retry-After": "1"}
GC_THRESHOLD = 35_000
SETTINGS_ENV = "CLAWSTREAM_GATEWAY_SETTINGS"  # what `gateway --workers N` hands its processes


class UpstreamUnavailable(Exception):
    """The backend could not be reached or answered 5xx before any byte went to the client."""


@dataclass
class Answer:
    """What a chat call sends back: a whole body, or the chunks of a stream.

    A stream's relay waits for the engine inside `with answer.waiting:`, so the server can
    make a client's hang-up cancel those waits (and only those)."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    chunks: AsyncIterator[bytes] | None = None
    waiting: contextlib.AbstractContextManager[Any] = field(default_factory=contextlib.nullcontext)


@dataclass
class SessionCtx:
    session_id: str
    group_id: str | None
    turn_type: str
    done: bool
    convention: str


def check_id(value: str, name: str) -> None:
    if not 0 < len(value) <= 256 or not value.isprintable():
        raise OpenAIError(422, f"{name} must be 1-256 printable characters", param=name)


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
    """The gateway's Prometheus metrics; with several processes, /metrics sums them all."""

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


class Gateway:
    def __init__(self, settings: Settings):
        g = settings.gateway
        self.settings = settings
        self.topics = settings.topics
        self.admin_key = settings.resolved_admin_key()
        self.client_key = g.client_key
        self.max_body = g.max_body_bytes
        self.metrics = m = Metrics()
        self._chat_ok = m.requests.labels("chat", "200")
        self._stream_ok = m.requests.labels("chat_stream", "200")
        self._latency_json = m.latency.labels("false")
        self._latency_stream = m.latency.labels("true")
        self._steps_published = m.steps.labels("published")
        self._steps_spooled = m.steps.labels("spooled")
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(g.upstream_timeout_s, connect=2.0),
            limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
        )
        self.pool = BackendPool(g.backends, self.http, g.health_interval_s)
        # the hot path uses aiohttp: per request it costs about half of httpx's CPU
        self.upstream: aiohttp.ClientSession | None = None
        self.upstream_timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=2.0, sock_read=g.upstream_timeout_s
        )
        self.sessions = SessionStore(settings.database_url)
        self.publisher = EventPublisher(
            settings.kafka_bootstrap,
            g.spool_dir or settings.data_dir / "spool" / f"gateway-{g.port}",
            timeout_s=g.publish_timeout_s,
            on_publish=self.metrics.publish.observe,
        )
        self.spool_depth = SpoolDepth(self.publisher.slot)
        self.metrics.registry.register(self.spool_depth)
        self._sweeper: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.upstream = aiohttp.ClientSession(
            timeout=self.upstream_timeout,
            connector=aiohttp.TCPConnector(limit=1024, ttl_dns_cache=300),
            auto_decompress=False,
        )
        await self.sessions.start()
        await self.publisher.start()
        with contextlib.suppress(Exception):  # the spool of an earlier run goes first
            await asyncio.wait_for(self.publisher.drain(), 10)
        await self.pool.start()
        self._sweeper = asyncio.create_task(self._sweep_idle())
        # A call allocates thousands of short-lived objects (token lists, parsed bodies) and
        # frees them by reference counting; the cyclic collector's frequent young-generation
        # passes over a large heap then cost more than the call itself. Objects alive after
        # start-up are exempt from collection, and young passes run 50 times less often.
        gc.freeze()
        gc.set_threshold(GC_THRESHOLD, 20, 20)

    async def stop(self) -> None:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            multiprocess.mark_process_dead(os.getpid())
        if self._sweeper:
            self._sweeper.cancel()
        await self.pool.stop()
        await self.publisher.stop()
        await self.sessions.stop()
        await self.http.aclose()
        if self.upstream is not None:
            await self.upstream.close()

    async def _sweep_idle(self) -> None:
        idle = self.settings.gateway.session_idle_timeout_s
        while True:
            await asyncio.sleep(min(30.0, idle / 4))
            try:
                for ended in await self.sessions.expire_idle(idle):
                    await self.emit(
                        SessionEvent(
                            session_id=ended.session_id,
                            kind="ended",
                            reason="idle_timeout",
                            n_steps=ended.n_steps,
                        )
                    )
            except Exception:
                log.exception("idle sweep failed")

    async def emit(self, event: Event) -> bool:
        key = getattr(event, "session_id", None) or "gateway"
        topic = self.topics.steps if event.id_field == "step_id" else self.topics.session_events
        return await self.publisher.publish(topic, key, event)

    async def dead_letter(self, key: str, payload: dict[str, Any], exc: Exception) -> None:
        letter = DeadLetter(
            source_topic=self.topics.steps,
            key=key,
            value=encode_json(payload, anything_as_text=True).decode(),
            error_type=type(exc).__name__,
            error=str(exc)[:4000],
            processor="gateway",
        )
        await self.publisher.publish(self.topics.dlq, key, letter)

    # -- auth and sessions ----------------------------------------------------------------

    @staticmethod
    def bearer(headers: Mapping[str, str]) -> str | None:
        header = headers.get("authorization", "")
        return header[7:].strip() if header[:7].lower() == "bearer " else None

    def is_admin(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token.encode(), self.admin_key.encode())

    def is_client(self, token: str | None) -> bool:
        if self.client_key is None:
            return True
        return token is not None and hmac.compare_digest(token.encode(), self.client_key.encode())

    async def resolve(
        self,
        headers: Mapping[str, str],
        body: dict[str, Any],
        path_session: str | None,
        path_group: str | None,
    ) -> SessionCtx:
        token = self.bearer(headers)
        body_session = body.pop("session_id", None)
        turn_type = headers.get("x-turn-type") or body.pop("turn_type", None) or "main"
        body.pop("turn_type", None)
        done_header = headers.get("x-session-done")
        done = (done_header or "").lower() in ("1", "true", "yes") or bool(
            body.pop("session_done", False)
        )
        if turn_type not in ("main", "side"):
            raise OpenAIError(422, "X-Turn-Type must be main or side", param="turn_type")
        if token and not self.is_admin(token) and not (self.client_key and self.is_client(token)):
            row = await self.sessions.by_key(token)
            if row is not None:
                if row.status != "active":
                    raise OpenAIError(401, "this session key's session has ended; start a new one")
                return SessionCtx(row.session_id, row.group_id, turn_type, done, "api_key")
            if self.client_key is not None or token.startswith("claw-sk-"):
                raise OpenAIError(401, "invalid API key")
        elif not self.is_client(token) and not self.is_admin(token):
            raise OpenAIError(401, "invalid API key")
        session_id = path_session or headers.get("x-session-id") or body_session
        convention = "path" if path_session else "header"
        if not session_id:
            session_id, done, convention = f"anon-{uuid.uuid4().hex}", True, "none"
        check_id(session_id, "session_id")
        if path_group is not None:
            check_id(path_group, "group_id")
        return SessionCtx(
            session_id, path_group or headers.get("x-group-id"), turn_type, done, convention
        )

    async def session_for_rl(self, request: Request, body_session: str | None) -> str:
        token = self.bearer(request.headers)
        if token and not self.is_admin(token) and not (self.client_key and self.is_client(token)):
            row = await self.sessions.by_key(token)
            if row is None:
                raise OpenAIError(401, "invalid API key")
            return row.session_id
        if not (self.is_client(token) or self.is_admin(token)):
            raise OpenAIError(401, "invalid API key")
        session_id = request.headers.get("x-session-id") or body_session
        if not session_id:
            raise OpenAIError(
                400, "which session? use its key, X-Session-Id or session_id", param="session_id"
            )
        if await self.sessions.get(session_id) is None:
            raise OpenAIError(404, f"unknown session {session_id}", param="session_id")
        return session_id

    # -- upstream -------------------------------------------------------------------------------

    async def _send(
        self, payload: bytes, session_id: str
    ) -> tuple[Backend, aiohttp.ClientResponse]:
        tried: set[Backend] = set()

        async def attempt() -> tuple[Backend, aiohttp.ClientResponse]:
            backend = self.pool.choose(session_id, tried)
            if backend is None:
                raise OpenAIError(
                    503, "no inference backend can answer right now", headers=RETRY_AFTER
                )
            tried.add(backend)
            assert self.upstream is not None
            backend.inflight += 1
            try:
                response = await self.upstream.post(
                    f"{backend.url}/v1/chat/completions",
                    data=payload,
                    headers={"content-type": "application/json"},
                )
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                backend.inflight -= 1
                self.pool.mark_failed(backend)
                self.metrics.upstream_errors.labels(backend.url).inc()
                raise UpstreamUnavailable(f"{backend.url}: {type(exc).__name__}: {exc}") from exc
            if response.status >= 500:
                await response.read()
                response.release()
                backend.inflight -= 1
                self.metrics.upstream_errors.labels(backend.url).inc()
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

    # -- chat ----------------------------------------------------------------------------------

    async def chat(
        self,
        headers: Mapping[str, str],
        raw: bytes,
        path_session: str | None = None,
        path_group: str | None = None,
    ) -> Answer:
        started = time.perf_counter()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise OpenAIError(400, f"request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise OpenAIError(400, "request body must be a JSON object")
        try:
            ChatRequest.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise OpenAIError(422, f"{where}: {first['msg']}", param=where) from None
        ctx = await self.resolve(headers, body, path_session, path_group)
        for name in SESSION_FIELDS:
            body.pop(name, None)
        step_ctx = StepContext(uuid7(), ctx.session_id, ctx.group_id, ctx.turn_type, -1, body)
        # The session row and the request half of the Step are done while the engine works;
        # the Step waits for them, the client's answer does not.
        preparing = self._keep(self._prepare_step(step_ctx, ctx.convention))
        try:
            return await self._answer(step_ctx, ctx, preparing, started)
        except Exception:
            await self._give_back(step_ctx, preparing)
            raise
        except BaseException:
            self._keep(self._give_back(step_ctx, preparing))
            raise

    async def _answer(
        self, step_ctx: StepContext, ctx: SessionCtx, preparing: asyncio.Task[None], started: float
    ) -> Answer:
        body = step_ctx.body
        upstream_body, asked = prepare_upstream(body)
        stream = bool(body.get("stream"))
        backend, response = await self._send(orjson.dumps(upstream_body), ctx.session_id)
        step_ctx.engine = backend.url
        if stream and response.status == 200:
            answer = Answer(
                200,
                {
                    "content-type": "text/event-stream",
                    "cache-control": "no-cache",
                    "x-claw-step-id": str(step_ctx.step_id),
                    "x-claw-weight-version": response.headers.get("x-claw-weight-version", "0"),
                },
            )
            answer.chunks = self._relay(
                response, backend, ctx, step_ctx, preparing, asked, started, answer
            )
            return answer
        try:
            content = await response.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise OpenAIError(502, f"the inference backend broke off: {exc}") from None
        finally:
            backend.inflight -= 1
            response.release()
        if response.status != 200:  # the engine's own error, passed on as it is
            await self._give_back(step_ctx, preparing)
            self.metrics.requests.labels("chat", str(response.status)).inc()
            return Answer(response.status, {"content-type": "application/json"}, content)
        try:
            answer = parse_answer(content)
        except orjson.JSONDecodeError:
            raise OpenAIError(502, "the inference backend sent invalid JSON") from None
        if not isinstance(answer, dict):
            raise OpenAIError(502, "the inference backend sent a JSON value that is no object")
        version = weight_version(
            answer, response.headers.get("x-claw-weight-version"), body.get("model")
        )
        latency_ms = (time.perf_counter() - started) * 1000
        await preparing
        await self.record(step_ctx, answer, version, latency_ms, ctx)
        strip_response(answer, asked)
        self._chat_ok.inc()
        self._latency_json.observe(time.perf_counter() - started)
        return Answer(
            200,
            {
                "content-type": "application/json",
                "x-claw-step-id": str(step_ctx.step_id),
                "x-claw-weight-version": str(version),
            },
            encode_json(answer),
        )

    def _keep(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """`work` as a task that runs to its end, whatever becomes of the call it serves."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _give_back(
        self, step_ctx: StepContext, preparing: asyncio.Task[None] | None = None
    ) -> None:
        """A call that ends without a Step hands its turn index back (once), so the stitcher
        does not wait for a Step that never comes; see `SessionStore.give_back`."""
        if step_ctx.settled:
            return
        step_ctx.settled = True
        if preparing is not None:
            await asyncio.wait([preparing])
        if step_ctx.counted:
            try:
                await self.sessions.give_back(step_ctx.session_id, step_ctx.turn_index)
            except Exception as exc:  # the gap stays: the stitcher waits it out
                log.warning(
                    "cannot give back turn %s of %s: %r",
                    step_ctx.turn_index,
                    step_ctx.session_id,
                    exc,
                )

    async def _prepare_step(self, step_ctx: StepContext, convention: str) -> None:
        """Count the call in its session (its turn index), announce a session not seen before
        (ahead of its first Step, so a session's events stay in order) and check the Step's
        request half."""
        touch = await self.sessions.touch(step_ctx.session_id, step_ctx.group_id, convention)
        step_ctx.turn_index = touch.turn_index
        step_ctx.counted = touch.counted
        step_ctx.request = check_request(step_ctx.body)
        if touch.created:
            await self.emit(
                SessionEvent(
                    session_id=step_ctx.session_id, kind="started", group_id=step_ctx.group_id
                )
            )

    async def record(
        self,
        step_ctx: StepContext,
        answer: dict[str, Any],
        version: int,
        latency_ms: float,
        ctx: SessionCtx,
        broken: ValueError | None = None,
    ) -> None:
        """Publish the Step (acks=all, or spooled) before the client gets the end of its answer;
        an answer that cannot make one (`broken`: a stream chunk could not be read) is
        dead-lettered instead."""
        try:
            if broken is not None:
                raise broken
            step_id, value = build_step(step_ctx, answer, version, latency_ms)
        except (ValidationError, EventError, ValueError, TypeError, KeyError) as exc:
            log.warning("cannot build a Step for %s: %s", step_ctx.step_id, exc)
            self.metrics.steps.labels("dead_letter").inc()
            await self.dead_letter(
                ctx.session_id, {"request": step_ctx.body, "response": answer}, exc
            )
            await self._give_back(step_ctx)
        else:
            step_ctx.settled = True
            published = await self.publisher.publish_encoded(
                self.topics.steps, ctx.session_id, value, Step.id_field, str(step_id)
            )
            (self._steps_published if published else self._steps_spooled).inc()
        if ctx.done and (ended := await self.sessions.end(ctx.session_id, "done")):
            await self.emit(
                SessionEvent(
                    session_id=ctx.session_id, kind="ended", reason="done", n_steps=ended.n_steps
                )
            )

    async def _relay(
        self,
        response: aiohttp.ClientResponse,
        backend: Backend,
        ctx: SessionCtx,
        step_ctx: StepContext,
        preparing: asyncio.Task[None],
        asked: ClientAsked,
        started: float,
        answer: Answer,
    ) -> AsyncIterator[bytes]:
        """Pass chunks through as they arrive; hold the answer's end until the Step is recorded.

        What the engine sent in one go leaves in one write: a token at a time when it streams
        token by token, all at once when it was fast."""
        try:
            capture = StreamCapture(asked)
            content = response.content
            try:
                while not capture.done:
                    block = content.read_nowait()  # what arrived already
                    if not block:
                        with answer.waiting:
                            block = await content.readany()
                        if not block:  # the engine's end, without [DONE]
                            if now := capture.close():
                                yield now
                            break
                    if now := capture.feed(block):
                        yield now
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                self.metrics.upstream_errors.labels(backend.url).inc()
                yield (
                    b"data: "
                    + orjson.dumps(error_body(502, f"upstream stream broke: {exc}"))
                    + b"\n\n"
                )
            finally:
                backend.inflight -= 1
                response.release()
            if not capture.done:  # the answer is incomplete: no Step
                await self._give_back(step_ctx, preparing)
                yield b"".join(capture.held) + DONE
                return
            whole = capture.as_response()
            version = weight_version(
                whole, response.headers.get("x-claw-weight-version"), step_ctx.body.get("model")
            )
            await preparing
            latency_ms = (time.perf_counter() - started) * 1000
            await self.record(step_ctx, whole, version, latency_ms, ctx, capture.broken)
            self._stream_ok.inc()
            self._latency_stream.observe(time.perf_counter() - started)
            yield b"".join(capture.held) + DONE
        finally:  # the client left, or the relay failed, before the Step was recorded
            if not step_ctx.settled:
                self._keep(self._give_back(step_ctx, preparing))


def create_app(settings: Settings) -> FrontDoor:
    """The gateway's ASGI app: chat completions straight to `Gateway.chat`, the rest FastAPI."""
    gateway = Gateway(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    app = FastAPI(title="claw-stream gateway", version="1", lifespan=lifespan)
    app.state.gateway = gateway
    install_error_handlers(app, validation_status=422)
    chat_body = {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": ChatRequest.model_json_schema()}},
        }
    }

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {
            "status": "ok",
            "spooled": gateway.publisher.slot.depth(),
            "backends": [
                {"url": b.url, "healthy": b.healthy, "inflight": b.inflight}
                for b in gateway.pool.backends
            ],
        }

    @app.get("/metrics")
    async def metrics() -> Response:
        registry = gateway.metrics.registry
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            registry.register(gateway.spool_depth)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def models() -> Response:
        backend = gateway.pool.choose(None, set())
        if backend is None:
            raise OpenAIError(503, "no inference backend can answer right now", headers=RETRY_AFTER)
        try:
            r = await gateway.http.get(f"{backend.url}/v1/models", timeout=5)
        except httpx.HTTPError as exc:
            raise OpenAIError(503, f"backend unavailable: {exc}", headers=RETRY_AFTER) from None
        return Response(r.content, status_code=r.status_code, media_type="application/json")

    async def chat(request: Request) -> Response:
        """The FastAPI form of the route: FrontDoor serves it without FastAPI in between."""
        params = request.path_params
        answer = await gateway.chat(
            request.headers,
            await read_body(request.headers, request.receive, gateway.max_body),
            params.get("session_id"),
            params.get("group_id"),
        )
        if answer.chunks is not None:
            return StreamingResponse(answer.chunks, answer.status, answer.headers)
        return Response(answer.body, answer.status, answer.headers)

    for prefix in ("", "/{session_id}", "/{session_id}/{group_id}"):
        app.add_api_route(f"{prefix}/v1/models", models, methods=["GET"], tags=["openai"])
        app.add_api_route(
            f"{prefix}/v1/chat/completions",
            chat,
            methods=["POST"],
            tags=["openai"],
            openapi_extra=chat_body,
        )

    @app.post("/rl/start_session", response_model=StartSessionResponse, tags=["sessions"])
    async def start_session(body: StartSessionRequest, request: Request) -> StartSessionResponse:
        if not gateway.is_admin(gateway.bearer(request.headers)):
            raise OpenAIError(401, "admin key required (Authorization: Bearer <admin key>)")
        session_id, api_key, ended = await gateway.sessions.start_session(
            body.api_key, body.group_id
        )
        if ended:
            await gateway.emit(
                SessionEvent(
                    session_id=ended.session_id,
                    kind="refreshed",
                    reason="refreshed",
                    n_steps=ended.n_steps,
                )
            )
        await gateway.emit(
            SessionEvent(session_id=session_id, kind="started", group_id=body.group_id)
        )
        return StartSessionResponse(
            session_id=session_id,
            api_key=api_key,
            ended_session_id=ended.session_id if ended else None,
        )

    @app.post("/rl/set_reward", response_model=Accepted, tags=["sessions"])
    async def set_reward(body: RewardRequest, request: Request) -> Accepted:
        session_id = await gateway.session_for_rl(request, body.session_id)
        event = SessionEvent(
            session_id=session_id, kind="reward", reward=body.reward, step_id=body.step_id
        )
        return Accepted(
            session_id=session_id, event_id=str(event.event_id), published=await gateway.emit(event)
        )

    @app.post("/rl/feedback", response_model=Accepted, tags=["sessions"])
    async def feedback(body: FeedbackRequest, request: Request) -> Accepted:
        if body.score is None and not body.text:
            raise OpenAIError(422, "feedback needs score (-1, 0 or 1) or text", param="score")
        session_id = await gateway.session_for_rl(request, body.session_id)
        event = SessionEvent(
            session_id=session_id,
            kind="feedback",
            score=body.score,
            text=body.text,
            step_id=body.step_id,
        )
        return Accepted(
            session_id=session_id, event_id=str(event.event_id), published=await gateway.emit(event)
        )

    @app.post("/rl/end_session", response_model=Accepted, tags=["sessions"])
    async def end_session(body: EndSessionRequest, request: Request) -> Accepted:
        session_id = await gateway.session_for_rl(request, body.session_id)
        ended = await gateway.sessions.end(session_id, "ended")
        event = SessionEvent(
            session_id=session_id,
            kind="ended",
            reason="client",
            n_steps=ended.n_steps if ended else None,
        )
        return Accepted(
            session_id=session_id, event_id=str(event.event_id), published=await gateway.emit(event)
        )

    return FrontDoor(app, gateway)


def app_from_environment() -> FrontDoor:
    """The app of one process of `claw-stream gateway --workers N` (a uvicorn factory)."""
    return create_app(Settings.model_validate_json(os.environ[SETTINGS_ENV]))
