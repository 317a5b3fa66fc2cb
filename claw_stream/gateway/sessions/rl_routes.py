"""The session API under /rl: start (or refresh) a session, rewards, feedback, the end."""

from __future__ import annotations

import hashlib
from typing import Any

from fastapi import APIRouter, Request

from claw_stream.dialect import OpenAIError
from claw_stream.events import SessionEvent
from claw_stream.gateway.capture import step_id_of
from claw_stream.gateway.service import Gateway
from claw_stream.gateway.sessions.protocol import (
    Accepted,
    EndSessionRequest,
    FeedbackRequest,
    ForgetAnswer,
    ForgetRequest,
    Revoked,
    RevokeKeyRequest,
    RewardRequest,
    SessionGrant,
    StartSessionRequest,
    StartSessionResponse,
    TrainSwitch,
    TrainSwitched,
)
from claw_stream.gateway.sessions.store import RequestExpired, RequestReused, StartAsk, Started
from claw_stream.store.consent import ForgottenAlready, NothingToForget
from claw_stream.tenants import check_tenant

router = APIRouter(prefix="/rl", tags=["sessions"])


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


@router.post("/start_session", response_model=StartSessionResponse)
async def start_session(body: StartSessionRequest, request: Request) -> StartSessionResponse:
    """Start a session (or refresh one): its id and a session key for the client to call
    with. The admin key only."""
    gateway = _gateway(request)
    await gateway.auth.authorize(request.headers, "admin_route", {})
    if body.tenant is not None:
        try:
            check_tenant(body.tenant, gateway.settings.policy_name)
        except ValueError as exc:
            raise OpenAIError(400, str(exc), param="tenant") from None
    ask = StartAsk(
        api_key=body.api_key,
        group_id=body.group_id,
        task_id=body.task_id,
        n=body.group_size,
        request_id=body.request_id,
        train=body.train,
        tenant=body.tenant,
        body_hash=hashlib.sha256(
            body.model_dump_json(exclude={"request_expires_at"}).encode()
        ).hexdigest(),
    )
    try:
        started = await gateway.sessions.start_sessions(ask, expires_at=body.request_expires_at)
    except RequestExpired as exc:
        raise OpenAIError(400, str(exc), param="request_expires_at") from None
    except RequestReused:
        raise OpenAIError(
            409,
            f"request_id {body.request_id} was already used with a different body",
            param="request_id",
        ) from None
    if not started.replayed:
        await _announce(gateway, started, body.task_id, body.metadata)
    first = started.grants[0]
    return StartSessionResponse(
        session_id=first.session_id,
        api_key=first.api_key,
        ended_session_id=started.ended.session_id if started.ended else None,
        group_id=started.group_id,
        task_id=body.task_id,
        tenant=body.tenant,
        sessions=[SessionGrant(session_id=g.session_id, api_key=g.api_key) for g in started.grants],
    )


async def _announce(
    gateway: Gateway,
    started: Started,
    task_id: str | None,
    metadata: dict[str, Any] | None = None,
) -> None:
    ended = started.ended
    if ended is not None:
        if ended.episode_reward is None:
            # AReaL ends a refreshed session with reward 0 when none was set: the episode
            # still counts, as neither success nor failure
            await gateway.emit(
                SessionEvent(
                    session_id=ended.session_id, kind="reward", reward=0.0, reason="refresh_default"
                )
            )
        await gateway.emit(
            SessionEvent(
                session_id=ended.session_id,
                kind="refreshed",
                reason="refreshed",
                n_steps=ended.n_steps,
            )
        )
    for grant in started.grants:
        await gateway.emit(
            SessionEvent(
                session_id=grant.session_id,
                kind="started",
                group_id=started.group_id,
                reason=f"task {task_id}" if task_id else None,
                metadata=metadata,
            )
        )


@router.post("/revoke_key", response_model=Revoked)
async def revoke_key(body: RevokeKeyRequest, request: Request) -> Revoked:
    """Refuse a session key from now on (401); its session ends if it was active."""
    gateway = _gateway(request)
    await gateway.auth.authorize(request.headers, "admin_route", {})
    revoked = await gateway.sessions.revoke(body.api_key)
    if revoked is None:
        raise OpenAIError(404, "no session was ever bound to this key", param="api_key")
    session_id, ended = revoked
    if ended is not None:
        await gateway.emit(
            SessionEvent(
                session_id=session_id, kind="ended", reason="revoked", n_steps=ended.n_steps
            )
        )
    return Revoked(session_id=session_id, ended=ended is not None)


@router.post("/set_reward", response_model=Accepted)
async def set_reward(body: RewardRequest, request: Request) -> Accepted:
    """A reward for one call (`step_id` or `interaction_id`) or, without one, for the whole
    episode; it takes precedence over what the judge says."""
    gateway = _gateway(request)
    step_id = body.step_id
    if body.interaction_id is not None:
        named = step_id_of(body.interaction_id)
        if named is None:
            raise OpenAIError(
                422,
                f"interaction_id {body.interaction_id!r} is not the id of a completion this "
                "gateway returned (chatcmpl-, resp_ or msg_ and a step id)",
                param="interaction_id",
            )
        if step_id is not None and step_id != named:
            raise OpenAIError(422, "step_id and interaction_id name different steps")
        step_id = named
    session_id = await gateway.auth.session_for_rl(request.headers, body.session_id)
    event = SessionEvent(
        session_id=session_id,
        kind="reward",
        reward=body.reward,
        step_id=step_id,
        metadata=body.metadata,
    )
    if step_id is None:
        await gateway.sessions.set_episode_reward(session_id, body.reward)
    return Accepted(
        session_id=session_id, event_id=str(event.event_id), published=await gateway.emit(event)
    )


@router.post("/feedback", response_model=Accepted)
async def feedback(body: FeedbackRequest, request: Request) -> Accepted:
    """The user's thumbs (`score` -1, 0 or 1) and/or words about a call or the session."""
    gateway = _gateway(request)
    if body.score is None and not body.text:
        raise OpenAIError(422, "feedback needs score (-1, 0 or 1) or text", param="score")
    session_id = await gateway.auth.session_for_rl(request.headers, body.session_id)
    text = body.text
    if text and gateway.redactor is not None:  # the words may become a skill: as Steps' are
        text = gateway.redactor.text(text).text
    event = SessionEvent(
        session_id=session_id,
        kind="feedback",
        score=body.score,
        text=text,
        step_id=body.step_id,
    )
    return Accepted(
        session_id=session_id, event_id=str(event.event_id), published=await gateway.emit(event)
    )


@router.post("/end_session", response_model=Accepted)
async def end_session(body: EndSessionRequest, request: Request) -> Accepted:
    """End the session: its last turn is judged without waiting for the user's next words."""
    gateway = _gateway(request)
    session_id = await gateway.auth.session_for_rl(request.headers, body.session_id)
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


@router.post("/sessions/{session_id}/train", response_model=TrainSwitched)
async def switch_training(session_id: str, body: TrainSwitch, request: Request) -> TrainSwitched:
    """Don't train (or train again) a session: the admin key or the session's own key."""
    gateway = _gateway(request)
    caller, _ = await gateway.auth.authorize(
        request.headers, "session_route", {"the URL path": session_id}
    )
    if caller.credential not in ("admin", "session"):
        raise OpenAIError(
            403, "only the admin key or the session's own key may switch its training"
        )
    if not await gateway.sessions.set_train(session_id, body.enabled):
        raise OpenAIError(404, f"unknown session {session_id}", param="session_id")
    event = SessionEvent(session_id=session_id, kind="train", train=body.enabled)
    return TrainSwitched(
        session_id=session_id,
        event_id=str(event.event_id),
        published=await gateway.emit(event),
        train=body.enabled,
    )


@router.post("/forget", response_model=ForgetAnswer)
async def forget(body: ForgetRequest, request: Request) -> ForgetAnswer:
    """Delete a session (or every session of a key, before a time, or of a tenant, with its
    adapter) from every table; the worker, replay and the trainer never take it in again.
    The admin key only."""
    gateway = _gateway(request)
    await gateway.auth.authorize(request.headers, "admin_route", {})
    param = next(
        name for name in ("session_id", "api_key", "before", "tenant") if getattr(body, name)
    )
    try:
        done = await gateway.forget(
            session_id=body.session_id,
            api_key=body.api_key,
            before=body.before,
            tenant=body.tenant,
        )
    except ForgottenAlready as exc:
        raise OpenAIError(409, str(exc), param=param) from None
    except NothingToForget as exc:
        raise OpenAIError(404, str(exc), param=param) from None
    return ForgetAnswer(sessions=done.sessions, removed=done.removed, kept=gateway.forget_keeps())
