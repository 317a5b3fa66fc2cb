"""What the gateway checks of a Responses request before translating it to chat."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)


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
