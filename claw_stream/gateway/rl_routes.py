"""The session API under /rl: start (or refresh) a session, rewards, feedback, the end."""

from __future__ import annotations

from fastapi import APIRouter, Request

from claw_stream.dialect import OpenAIError
from claw_stream.events import SessionEvent
from claw_stream.gateway.protocol import (
    Accepted,
    EndSessionRequest,
    FeedbackRequest,
    Revoked,
    RevokeKeyRequest,
    RewardRequest,
    StartSessionRequest,
    StartSessionResponse,
)
from claw_stream.gateway.service import Gateway

router = APIRouter(prefix="/rl", tags=["sessions"])


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


@router.post("/start_session", response_model=StartSessionResponse)
async def start_session(body: StartSessionRequest, request: Request) -> StartSessionResponse:
    gateway = _gateway(request)
    await gateway.auth.authorize(request.headers, "admin_route", None)
    session_id, api_key, ended = await gateway.sessions.start_session(body.api_key, body.group_id)
    if ended:
        await gateway.emit(
            SessionEvent(
                session_id=ended.session_id,
                kind="refreshed",
                reason="refreshed",
                n_steps=ended.n_steps,
            )
        )
    await gateway.emit(SessionEvent(session_id=session_id, kind="started", group_id=body.group_id))
    return StartSessionResponse(
        session_id=session_id,
        api_key=api_key,
        ended_session_id=ended.session_id if ended else None,
    )


@router.post("/revoke_key", response_model=Revoked)
async def revoke_key(body: RevokeKeyRequest, request: Request) -> Revoked:
    """Refuse a session key from now on (401); its session ends if it was active."""
    gateway = _gateway(request)
    await gateway.auth.authorize(request.headers, "admin_route", None)
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
    gateway = _gateway(request)
    session_id = await gateway.auth.session_for_rl(request.headers, body.session_id)
    event = SessionEvent(
        session_id=session_id, kind="reward", reward=body.reward, step_id=body.step_id
    )
    return Accepted(
        session_id=session_id, event_id=str(event.event_id), published=await gateway.emit(event)
    )


@router.post("/feedback", response_model=Accepted)
async def feedback(body: FeedbackRequest, request: Request) -> Accepted:
    gateway = _gateway(request)
    if body.score is None and not body.text:
        raise OpenAIError(422, "feedback needs score (-1, 0 or 1) or text", param="score")
    session_id = await gateway.auth.session_for_rl(request.headers, body.session_id)
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


@router.post("/end_session", response_model=Accepted)
async def end_session(body: EndSessionRequest, request: Request) -> Accepted:
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
