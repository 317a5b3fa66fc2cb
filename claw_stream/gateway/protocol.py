"""Request and response bodies of the gateway's own routes (chat bodies are passed through)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from claw_stream.events import UUID7

SESSION_FIELDS = ("session_id", "turn_type", "session_done")


class ChatRequest(BaseModel):
    """What the gateway checks of a chat request; every other field travels on untouched."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = None
    logprobs: bool | None = None
    return_token_ids: bool | None = None
    session_id: str | None = Field(default=None, min_length=1, max_length=256)
    turn_type: Literal["main", "side"] | None = None
    session_done: bool | None = None


class StartSessionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api_key: str | None = Field(default=None, min_length=8, max_length=256)
    group_id: str | None = Field(default=None, max_length=256)


class StartSessionResponse(BaseModel):
    session_id: str
    api_key: str
    ended_session_id: str | None = None


class RevokeKeyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api_key: str = Field(min_length=8, max_length=256)


class Revoked(BaseModel):
    session_id: str = Field(description="The session the key was bound to.")
    ended: bool = Field(description="True when revoking ended it (it was active).")


class SessionRef(BaseModel):
    """Which session an /rl call is about, when neither the key nor a header says it."""

    model_config = ConfigDict(extra="forbid")

    session_id: str | None = Field(default=None, min_length=1, max_length=256)


class RewardRequest(SessionRef):
    reward: float = Field(ge=-100.0, le=100.0, allow_inf_nan=False)
    step_id: UUID7 | None = None


class FeedbackRequest(SessionRef):
    score: Literal[-1, 0, 1] | None = None
    text: str | None = Field(default=None, max_length=20_000)
    step_id: UUID7 | None = None


class EndSessionRequest(SessionRef):
    pass


class Accepted(BaseModel):
    session_id: str
    event_id: str
    published: bool = Field(description="False when spooled locally until the broker returns.")
