"""What the gateway checks of a chat completions request."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
)


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
