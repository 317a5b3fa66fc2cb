"""Request and response bodies of the gateway's own routes (chat bodies are passed through)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from claw_stream.events import UUID7

SESSION_FIELDS = ("session_id", "turn_type", "session_done", "train")  # the body extension
# What the Responses and Messages doors note of a call beyond its chat body (tools left out,
# fields not honoured): the Step keeps it in `request.extra`, the engine never sees it.
DOOR_FIELD = "claw_door"


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
    train: bool | None = None  # false: this call is archived, never trained

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int | None) -> int | None:
        if n is not None and n != 1:
            raise ValueError(
                "n must be 1: the gateway records one Step per call; send n calls instead (the "
                "engine's prefix cache computes their shared prompt once)"
            )
        return n


class CompletionRequest(BaseModel):
    """A legacy completions request, as documented; the engine checks the rest."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    prompt: str | list[int] = Field(min_length=1)
    stream: bool = False
    max_tokens: int | None = None


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
    before a time."""

    model_config = ConfigDict(extra="forbid")

    session_id: str | None = Field(default=None, min_length=1, max_length=256)
    api_key: str | None = Field(default=None, min_length=8, max_length=256)
    before: AwareDatetime | None = Field(
        default=None, description="ISO 8601 with a time zone, e.g. 2026-11-01T00:00:00Z."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> ForgetRequest:
        named = [self.session_id, self.api_key, self.before]
        if sum(v is not None for v in named) != 1:
            raise ValueError("name exactly one of session_id, api_key, before")
        return self


class ForgetAnswer(BaseModel):
    sessions: list[str] = Field(description="The sessions forgotten.")
    removed: dict[str, int] = Field(description="Rows deleted, per table.")
    kept: str = Field(
        description="What stays: where the records cannot be deleted in place, and until when."
    )


# --- the other front doors: what the gateway checks before translating to chat completions ---


class ResponsesRequest(BaseModel):
    """An OpenAI Responses API request (`POST /v1/responses`); other fields are accepted and
    ignored (text.format, truncation, user, prompt_cache_key)."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]] = Field(min_length=1)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=256)
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    metadata: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    session_id: str | None = Field(default=None, min_length=1, max_length=256)
    turn_type: Literal["main", "side"] | None = None
    session_done: bool | None = None
    train: bool | None = None  # false: this call is archived, never trained

    @property
    def wants_encrypted_reasoning(self) -> bool:
        """`store: false` clients (Codex) ask for their reasoning back as an opaque token."""
        return "reasoning.encrypted_content" in (self.include or ())


class MessagesRequest(BaseModel):
    """An Anthropic Messages API request (`POST /v1/messages`); other fields are accepted and
    ignored (service_tier, context_management)."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    session_id: str | None = Field(default=None, min_length=1, max_length=256)
    turn_type: Literal["main", "side"] | None = None
    session_done: bool | None = None
    train: bool | None = None  # false: this call is archived, never trained


class CountTokensRequest(MessagesRequest):
    """`POST /v1/messages/count_tokens`: a Messages request without `max_tokens`."""

    max_tokens: int | None = Field(default=None, ge=1)  # type: ignore[assignment]


class CountTokensResponse(BaseModel):
    input_tokens: int
