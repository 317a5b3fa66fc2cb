"""What the gateway checks of a Messages request before translating it to chat."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)


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
