"""The chat completions door: one call in, the engine's answer out, one Step recorded.

Every LLM call becomes a `Step` on the steps topic before the client receives the end of its
answer (the JSON body, or the final chunks and `[DONE]`). The gateway asks the engine for token
ids and logprobs whatever the client asked, strips them unless the client asked, and builds
the Step from exactly the sampled tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from pydantic import ValidationError

from claw_stream.agents.recognition import AgentCall, agent_call
from claw_stream.dialect import ContextTooLong, OpenAIError, error_body
from claw_stream.events import EventError, SessionEvent, Step
from claw_stream.gateway.bodies import checked, read_object
from claw_stream.gateway.capture import (
    ClientAsked,
    StepContext,
    StreamCapture,
    build_step,
    check_request,
    completion_id,
    encode_json,
    parse_answer,
    prepare_upstream,
    strip_response,
    weight_version,
)
from claw_stream.gateway.chat.protocol import ChatRequest
from claw_stream.gateway.model_names import ModelNames
from claw_stream.gateway.protocol import SESSION_FIELDS
from claw_stream.gateway.sessions.auth import SessionCtx, presented_key
from claw_stream.gateway.sessions.bounds import KeyLimiter, PromptBound
from claw_stream.gateway.skills import caller
from claw_stream.gateway.upstreams import Backend, read_whole
from claw_stream.ids import uuid7
from claw_stream.skills.text import SKILLS_FIELD

if TYPE_CHECKING:
    from claw_stream.gateway.service import Gateway

log = logging.getLogger(__name__)
DONE = b"data: [DONE]\n\n"  # the end of an OpenAI event stream


@dataclass
class DoorAnswer:
    """What a door sends back: a whole body, or the chunks of a stream.

    A stream's relay waits for the engine inside `with answer.waiting:`, so the server can
    make a client's hang-up cancel those waits (and only those)."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    chunks: AsyncIterator[bytes] | None = None
    waiting: contextlib.AbstractContextManager[Any] = field(default_factory=contextlib.nullcontext)
    session_id: str | None = None  # the session the call was recorded in


class ChatDoor:
    def __init__(self, gateway: Gateway):
        self.gateway = gateway
        self.auth = gateway.auth
        self.upstream = gateway.upstream
        self.sessions = gateway.sessions
        self.publisher = gateway.publisher
        self.topics = gateway.topics
        self.max_body = gateway.settings.gateway.max_body_bytes
        self.hosted = gateway.settings.gateway.backend_kind == "hosted"
        self.bound = PromptBound(gateway.pool, lambda: self.upstream.session)
        self.limiter = KeyLimiter(gateway.settings.gateway.max_concurrent_per_key)
        self.names = ModelNames(
            gateway.pool,
            gateway.settings.gateway.model_map,
            gateway.settings.gateway.strict_models,
            gateway.settings.policy_name,
        )
        self.metrics = m = gateway.metrics
        self.refused: dict[str, int] = {}  # the largest prompt refused as too long, by agent
        self._chat_ok = m.requests.labels("chat", "200")
        self._stream_ok = m.requests.labels("chat_stream", "200")
        self._latency_json = m.latency.labels("false")
        self._latency_stream = m.latency.labels("true")
        self._steps_published = m.steps.labels("published")
        self._steps_spooled = m.steps.labels("spooled")

    async def chat(
        self,
        headers: Mapping[str, str],
        raw: bytes,
        path_session: str | None = None,
        path_group: str | None = None,
    ) -> DoorAnswer:
        started = time.perf_counter()
        body = read_object(raw)
        checked(body, ChatRequest, 422)
        return await self.serve(headers, body, len(raw), path_session, path_group, started)

    async def serve(
        self,
        headers: Mapping[str, str],
        body: dict[str, Any],
        size: int,
        path_session: str | None,
        path_group: str | None,
        started: float,
        agent: AgentCall | None = None,
        fit_max_tokens: bool = False,
    ) -> DoorAnswer:
        """A checked chat-completions body (`size` bytes on the wire) through its session, the
        bounds, the engine and the Step; the other front doors translate into this, telling
        what the call's agent said of it (`agent`, else read from the headers) and whether
        its answer limit is lowered to fit the context (`bounds.PromptBound.check`)."""
        if agent is None:
            agent = agent_call(headers, body)
        ctx = await self.auth.resolve(headers, body, path_session, path_group, agent)
        for name in SESSION_FIELDS:
            body.pop(name, None)
        served = self.names.resolve(body["model"], ctx.tenant)
        skills = self.gateway.skills
        if skills.wanted(ctx.turn_type, headers):
            user = caller(ctx.tenant, ctx.convention, headers)
            carried = await skills.carried(ctx.session_id, user, body["messages"])
            if carried is not None:
                body[SKILLS_FIELD] = carried.note()
                size += len(carried.text)
        try:
            await self.bound.check(body, size, served, fit_max_tokens)
        except ContextTooLong as exc:
            if exc.prompt_overflows:
                who = agent.agent or "other"
                self.metrics.context_refused.labels(who).inc()
                self.refused[who] = max(self.refused.get(who, 0), exc.n_prompt)
                self.metrics.refused_prompt.labels(who).set(self.refused[who])
            raise
        release = self.limiter.acquire(presented_key(headers))
        step_ctx = StepContext(uuid7(), ctx.session_id, ctx.group_id, ctx.turn_type, -1, body)
        step_ctx.served_model = served
        step_ctx.tenant = ctx.tenant
        step_ctx.redactor = self.gateway.redactor
        # The session row and the request half of the Step are done while the engine works;
        # the Step waits for them, the client's answer does not.
        preparing = self.gateway.keep(self._prepare_step(step_ctx, ctx))
        try:
            answer = await self._answer(step_ctx, ctx, preparing, started)
        except Exception:
            release()
            await self._give_back(step_ctx, preparing)
            raise
        except BaseException:
            release()
            self.gateway.keep(self._give_back(step_ctx, preparing))
            raise
        answer.session_id = ctx.session_id
        if answer.chunks is None:
            release()
        elif self.limiter.limit is not None:
            answer.chunks = _released(answer.chunks, release)
        return answer

    async def serve_translated(
        self,
        headers: Mapping[str, str],
        chat: dict[str, Any],
        body: dict[str, Any],
        size: int,
        path_session: str | None,
        path_group: str | None,
        started: float,
    ) -> DoorAnswer:
        """A call another front door translated from its `body` into `chat`: what its agent
        says of it read from that body, its answer limit fitted to the room the prompt leaves
        (the agents of those APIs ask for a fixed large one)."""
        agent = agent_call(headers, body)
        return await self.serve(
            headers, chat, size, path_session, path_group, started, agent, fit_max_tokens=True
        )

    async def _answer(
        self, step_ctx: StepContext, ctx: SessionCtx, preparing: asyncio.Task[None], started: float
    ) -> DoorAnswer:
        body = step_ctx.body
        upstream_body, asked = prepare_upstream(
            body, completion_id(step_ctx.step_id), step_ctx.served_model, self.hosted
        )
        stream = bool(body.get("stream"))
        backend, response = await self.upstream.send(orjson.dumps(upstream_body), ctx.session_id)
        step_ctx.engine = backend.url
        if stream and response.status == 200:
            answer = DoorAnswer(
                200,
                {
                    "content-type": "text/event-stream",
                    "cache-control": "no-cache",
                    "x-claw-step-id": str(step_ctx.step_id),
                    "x-claw-session-id": ctx.session_id,
                    "x-claw-weight-version": response.headers.get("x-claw-weight-version", "0"),
                },
            )
            answer.chunks = self._relay(
                response, backend, ctx, step_ctx, preparing, asked, started, answer
            )
            return answer
        content = await read_whole(backend, response)
        if response.status != 200:  # the engine's own error, passed on as it is
            await self._give_back(step_ctx, preparing)
            self.metrics.requests.labels("chat", str(response.status)).inc()
            return DoorAnswer(response.status, {"content-type": "application/json"}, content)
        try:
            answer = parse_answer(content)
        except orjson.JSONDecodeError:
            raise OpenAIError(502, "the inference backend sent invalid JSON") from None
        if not isinstance(answer, dict):
            raise OpenAIError(502, "the inference backend sent a JSON value that is no object")
        version = weight_version(
            answer, response.headers.get("x-claw-weight-version"), step_ctx.served_model
        )
        latency_ms = (time.perf_counter() - started) * 1000
        await preparing
        await self.record(step_ctx, answer, version, latency_ms, ctx)
        strip_response(answer, asked)
        self._chat_ok.inc()
        self._latency_json.observe(time.perf_counter() - started)
        return DoorAnswer(
            200,
            {
                "content-type": "application/json",
                "x-claw-step-id": str(step_ctx.step_id),
                "x-claw-session-id": ctx.session_id,  # the one it was filed under
                "x-claw-weight-version": str(version),
            },
            encode_json(answer),
        )

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

    async def _prepare_step(self, step_ctx: StepContext, ctx: SessionCtx) -> None:
        """Count the call in its session (its turn index), announce a session not seen before
        (ahead of its first Step, so a session's events stay in order) and check the Step's
        request half."""
        touch = await self.sessions.touch(step_ctx.session_id, step_ctx.group_id, ctx.convention)
        step_ctx.turn_index = touch.turn_index
        step_ctx.counted = touch.counted
        if not touch.counted:
            self.metrics.calls_without_store.inc()
        step_ctx.train = step_ctx.train and ctx.train and touch.train
        step_ctx.request = check_request(step_ctx.body, step_ctx.redactor)
        if touch.created or ctx.new_episode:
            await self.gateway.emit(
                SessionEvent(
                    session_id=step_ctx.session_id,
                    kind="started",
                    group_id=step_ctx.group_id,
                    reason=ctx.new_episode,
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
            log.warning(
                "cannot build a Step for %s: %s",
                step_ctx.step_id,
                self.gateway.scrub(exc, type(exc).__name__),
            )
            self.metrics.steps.labels("dead_letter").inc()
            await self.gateway.dead_letter(
                ctx.session_id, {"request": step_ctx.body, "response": answer}, exc
            )
            await self._give_back(step_ctx)
        else:
            step_ctx.settled = True
            published = await self.publisher.publish_encoded(
                self.topics.steps, ctx.session_id, value, Step.id_field, str(step_id)
            )
            (self._steps_published if published else self._steps_spooled).inc()
            # a side call (an agent's compaction, a title) never opens a main line
            if (
                ctx.convention == "prefix"
                and ctx.turn_type == "main"
                and self.gateway.lines is not None
            ):
                self._extend_line(step_ctx, answer)
        if ctx.done and (ended := await self.sessions.end_when_reachable(ctx.session_id, "done")):
            await self.gateway.emit(
                SessionEvent(
                    session_id=ctx.session_id, kind="ended", reason="done", n_steps=ended.n_steps
                )
            )

    def _extend_line(self, step_ctx: StepContext, answer: dict[str, Any]) -> None:
        """Where this session's main line stands now, for the next call that names none: in
        this replica's memory at once, in Postgres in the background."""
        assert self.gateway.lines is not None
        try:
            reply = answer["choices"][0]["message"]
            stored = self.gateway.lines.extend(
                step_ctx.session_id, step_ctx.body["messages"], reply
            )
        except (LookupError, TypeError, AttributeError) as exc:  # an answer with no message
            log.warning("cannot record the main line of %s: %r", step_ctx.session_id, exc)
            return
        self.gateway.keep(self._logged(stored, step_ctx.session_id))

    @staticmethod
    async def _logged(stored: Coroutine[Any, Any, None], session_id: str) -> None:
        try:
            await stored
        except Exception as exc:  # the next call then starts a session of its own
            log.warning("cannot record the main line of %s: %r", session_id, exc)

    async def _relay(
        self,
        response: aiohttp.ClientResponse,
        backend: Backend,
        ctx: SessionCtx,
        step_ctx: StepContext,
        preparing: asyncio.Task[None],
        asked: ClientAsked,
        started: float,
        answer: DoorAnswer,
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
                whole, response.headers.get("x-claw-weight-version"), step_ctx.served_model
            )
            await preparing
            latency_ms = (time.perf_counter() - started) * 1000
            await self.record(step_ctx, whole, version, latency_ms, ctx, capture.broken)
            self._stream_ok.inc()
            self._latency_stream.observe(time.perf_counter() - started)
            yield b"".join(capture.held) + DONE
        finally:  # the client left, or the relay failed, before the Step was recorded
            if not step_ctx.settled:
                self.gateway.keep(self._give_back(step_ctx, preparing))


async def _released(
    chunks: AsyncIterator[bytes], release: Callable[[], None]
) -> AsyncIterator[bytes]:
    """A stream's chunks, its key's slot given back when the stream ends or is dropped."""
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        release()
        await chunks.aclose()  # type: ignore[attr-defined]
