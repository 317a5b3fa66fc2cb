"""Bodies of the session API (`/rl/*`)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

from claw_stream.events import UUID7
from claw_stream.tenants import check_tenant

METADATA_MAX_BYTES = 65_536


def _bounded_metadata(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is not None and len(json.dumps(value)) > METADATA_MAX_BYTES:
        raise ValueError(f"metadata must encode to at most {METADATA_MAX_BYTES} bytes of JSON")
    return value


SessionMetadata = Annotated[
    dict[str, Any] | None,
    AfterValidator(_bounded_metadata),
    Field(
        description="Anything about the session the reward sources should know (a task's "
        "expected answer, ...): the worker hands it to each one with every turn."
    ),
]


class StartSessionRequest(BaseModel):
    """Ours (`api_key`, `group_id`) and AReaL's (`task_id`, `group_size`, `request_id`,
    `request_expires_at`) fields."""

    model_config = ConfigDict(extra="forbid")

    api_key: str | None = Field(
        default=None,
        min_length=8,
        max_length=256,
        description="Bind this key (refresh: its current session ends); a new one when null.",
    )
    group_id: str | None = Field(default=None, min_length=1, max_length=256)
    task_id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9._:-]{1,128}$",
        description="The task the session plays; the session id starts with it.",
    )
    group_size: int = Field(
        default=1, ge=1, le=256, description="One session per group member, one group_id (GRPO)."
    )
    request_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Retry token: the same request_id gets the same answer.",
    )
    request_expires_at: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description="Unix seconds after which the request is refused (unless already served).",
    )
    train: bool = Field(
        default=True, description="False: the sessions' calls are archived, never trained."
    )
    metadata: SessionMetadata = None
    tenant: Annotated[str, AfterValidator(check_tenant)] | None = Field(
        default=None,
        description="Whose agent the sessions serve: its calls are served by the tenant's "
        "adapter where it has one (tenants.py).",
    )

    @model_validator(mode="after")
    def _one_key_one_session(self) -> StartSessionRequest:
        if self.api_key is not None and self.group_size > 1:
            raise ValueError("an api_key binds one session: leave it out when group_size > 1")
        return self


class SessionGrant(BaseModel):
    session_id: str
    api_key: str


class StartSessionResponse(BaseModel):
    session_id: str = Field(description="The (first) new session.")
    api_key: str = Field(description="Its key: the agent's Bearer token.")
    ended_session_id: str | None = Field(default=None, description="The session a refresh ended.")
    group_id: str | None = None
    task_id: str | None = None
    tenant: str | None = None
    sessions: list[SessionGrant] = Field(
        description="Every new session with its key: group_size of them."
    )


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
    interaction_id: str | None = Field(
        default=None,
        max_length=128,
        description="The `id` of a completion this gateway returned (AReaL): rewards that "
        "one; with neither this nor step_id the reward is the episode's.",
    )
    metadata: SessionMetadata = None


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


class TrainSwitch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        description="False: from now on the session's calls are not trained, and its turns "
        "not judged yet and samples no trainer took yet are withdrawn."
    )


class TrainSwitched(Accepted):
    train: bool


class ForgetRequest(BaseModel):
    """Exactly one of: a session, every session a key was bound to, every session last seen
    before a time, a tenant (its sessions and its adapter)."""

    model_config = ConfigDict(extra="forbid")

    session_id: str | None = Field(default=None, min_length=1, max_length=256)
    api_key: str | None = Field(default=None, min_length=8, max_length=256)
    before: AwareDatetime | None = Field(
        default=None, description="ISO 8601 with a time zone, e.g. 2026-11-01T00:00:00Z."
    )
    tenant: Annotated[str, AfterValidator(check_tenant)] | None = Field(
        default=None, description="Every session of the tenant, and its adapter."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> ForgetRequest:
        named = [self.session_id, self.api_key, self.before, self.tenant]
        if sum(v is not None for v in named) != 1:
            raise ValueError("name exactly one of session_id, api_key, before, tenant")
        return self


class ForgetAnswer(BaseModel):
    sessions: list[str] = Field(description="The sessions forgotten.")
    removed: dict[str, int] = Field(description="Rows deleted, per table.")
    kept: str = Field(
        description="What stays: where the records cannot be deleted in place, and until when."
    )
